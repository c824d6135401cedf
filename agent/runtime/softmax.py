"""A softmax-attention transformer of the same width: the baseline our claims compare against.

Same embedding, norms, GLU and widths as a Laplace config, but each layer's token mixer is
causal multi-head softmax attention with rotary positions and a KV cache that grows by one
(K, V) pair per token per layer. Used by `laplace bench` (decode cost vs context) and as the
fair perplexity baseline for the default model. Not used to chat.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, RMSNorm, rope


ROPE_THETA = 10000.0  # the runtime's one RoPE (`layers.rope`), at Llama's original base


class KVCache:
    """Preallocated keys and values [L, B, H, T_max, Dh]; `length` tokens are filled."""

    def __init__(self, config: LaplaceConfig, batch: int, max_tokens: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        dh = config.d_model // config.n_heads
        shape = (config.n_layers, batch, config.n_heads, max_tokens, dh)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    @property
    def nbytes_used(self) -> int:
        per_token = self.k[:, :, :, :1].numel() * self.k.element_size() * 2
        return per_token * self.length


class SoftmaxAttention(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        start = cache.length if cache is not None else 0
        pos = torch.arange(start, start + T, device=x.device)
        q, k = rope(q, pos, ROPE_THETA), rope(k, pos, ROPE_THETA)
        if cache is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            cache.k[layer, :, :, start : start + T] = k
            cache.v[layer, :, :, start : start + T] = v
            keys, values = cache.k[layer, :, :, : start + T], cache.v[layer, :, :, : start + T]
            if T == 1:
                o = F.scaled_dot_product_attention(q, keys, values)
            else:  # causal within the new block, full view of the cached past
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, D))


class SoftmaxBlock(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = SoftmaxAttention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = GLU(config)

    def forward(self, x: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cache, layer)
        return x + self.ffn(self.ffn_norm(x))


class SoftmaxModel(nn.Module):
    """forward(input_ids [B, T], cache=None) -> logits [B, T, vocab]; the cache grows in place."""

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(SoftmaxBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        std = config.init_std
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=std)

    def forward(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        x = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += input_ids.shape[1]
        return self.lm_head(self.norm(x))
