"""The Laplace model: a pure Simple-GLA decoder. This file holds the math only.

State goes in and comes out of `forward` explicitly (never stored on modules), so the same
weights serve any number of sessions and a decode step always has the same shapes.
Sampling, stopping and streaming live in `generation.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.gla import gla_chunked, gla_step
from agent.runtime.state import RecurrentState


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class ShortConv(nn.Module):
    """Causal depthwise Conv1d of width W over d_model channels, with a W-slot cache.

    The cache holds the last W inputs; the conv reads the last W - 1 of them plus the new
    token (the oldest slot is kept so the state matches the published 4-slot layout)."""

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.empty(dim, width))

    def forward(self, x: Tensor, cache: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        # x: [B, T, D]; cache: [B, D, W] fp32; lengths: [B] valid tokens per row or None.
        B, T, D = x.shape
        W = self.width
        ext = torch.cat([cache.to(x.dtype), x.transpose(1, 2)], dim=2)  # [B, D, W + T]
        y = F.conv1d(ext[:, :, 1:], self.weight.to(x.dtype)[:, None, :], groups=D)  # [B, D, T]
        if lengths is None:
            new_cache = ext[:, :, T:]
        else:  # the last W *valid* inputs of each row: ext positions [n, n + W)
            idx = (lengths.view(B, 1, 1) + torch.arange(W, device=x.device).view(1, 1, W)).expand(B, D, W)
            new_cache = ext.gather(2, idx)
        return y.transpose(1, 2), new_cache.float()


class GLAAttention(nn.Module):
    """conv + SiLU -> q, k, v and a per-head scalar decay -> Simple GLA -> head norm -> gate -> o."""

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.conv = ShortConv(c.d_model, c.conv_size)
        self.q_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.value_dim, bias=False)
        self.gate_proj = nn.Linear(c.d_model, c.value_dim, bias=False)  # output gate
        self.o_proj = nn.Linear(c.value_dim, c.d_model, bias=False)
        # Per-head scalar decay gate, grouped: head h reads its own d_model / H channels.
        self.decay_weight = nn.Parameter(torch.zeros(c.n_heads, c.d_model // c.n_heads))
        self.decay_bias = nn.Parameter(torch.zeros(c.n_heads))
        self.head_norm = RMSNorm(c.head_v_dim, c.norm_eps)

    def log_decay(self, c: Tensor) -> Tensor:
        """g = logsigmoid(w x + b) / normalizer, per head: [B, T, D] -> [B, T, H] fp32."""
        B, T, _ = c.shape
        H = self.config.n_heads
        pre = torch.einsum("bthd,hd->bth", c.float().view(B, T, H, -1), self.decay_weight.float())
        return F.logsigmoid(pre + self.decay_bias.float()) / self.config.gate_normalizer

    def forward(
        self, x: Tensor, gla_state: Tensor, conv_state: Tensor, lengths: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        B, T, _ = x.shape
        c, conv_state = self.conv(x, conv_state, lengths)
        c = F.silu(c)
        q = self.q_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        k = self.k_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        v = self.v_proj(c).view(B, T, cfg.n_heads, cfg.head_v_dim)
        g = self.log_decay(c)
        if lengths is not None:  # padded positions: no write (k = 0) and no decay (g = 0)
            valid = torch.arange(T, device=x.device)[None, :] < lengths[:, None]  # [B, T]
            k = k * valid[:, :, None, None].to(k.dtype)
            g = g * valid[:, :, None].to(g.dtype)
        if T == 1:
            o, gla_state = gla_step(q, k, v, g, gla_state)
        else:
            o, gla_state = gla_chunked(q, k, v, g, gla_state, cfg.chunk_size)
        o = self.head_norm(o).reshape(B, T, cfg.value_dim)
        o = o * F.silu(self.gate_proj(x))
        return self.o_proj(o), gla_state, conv_state


class GLU(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = GLAAttention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = GLU(config)

    def forward(self, x: Tensor, gla_state: Tensor, conv_state: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        a, gla_state, conv_state = self.attn(self.attn_norm(x), gla_state, conv_state, lengths)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return x, gla_state, conv_state


class LaplaceModel(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> "LaplaceModel":
        """Normal(0, init_std) matrices, residual outputs scaled by 1/sqrt(2L), decay biases
        set to the half-life schedule and decay weights zero (so the schedule is exact)."""
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0 if seed is None else seed)
        c = self.config
        std = c.init_std

        def normal_(p: Tensor, s: float) -> None:
            p.copy_(torch.randn(p.shape, generator=gen) * s)

        normal_(self.embed.weight, std)
        normal_(self.lm_head.weight, std)
        self.norm.weight.fill_(1.0)
        biases = torch.tensor(c.gate_biases())
        for block in self.blocks:
            a = block.attn
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.gate_proj, block.ffn.w1, block.ffn.w3):
                normal_(lin.weight, std)
            for lin in (a.o_proj, block.ffn.w2):
                normal_(lin.weight, std / math.sqrt(2 * c.n_layers))
            normal_(a.conv.weight, 1.0 / math.sqrt(c.conv_size))
            a.decay_weight.zero_()
            a.decay_bias.copy_(biases)
            for norm in (block.attn_norm, block.ffn_norm, a.head_norm):
                norm.weight.fill_(1.0)
        return self

    def new_state(self, batch: int = 1) -> RecurrentState:
        return RecurrentState.zeros(self.config, batch, self.embed.weight.device)

    def forward(
        self,
        input_ids: Tensor,
        state: RecurrentState | None = None,
        *,
        lengths: Tensor | None = None,
        last_only: bool = False,
    ) -> tuple[Tensor, RecurrentState]:
        """input_ids [B, T] -> (logits [B, T, vocab] or [B, 1, vocab] with `last_only`, new state).

        `lengths` [B] marks how many leading tokens of each row are real; padded positions
        leave the state exactly as it was (used for fixed-shape buckets). The input state
        is never modified in place."""
        B, T = input_ids.shape
        if state is None:
            state = self.new_state(B)
        x = self.embed(input_ids)
        new_gla, new_conv = [], []
        for i, block in enumerate(self.blocks):
            x, s, cv = block(x, state.gla[i], state.conv[i], lengths)
            new_gla.append(s)
            new_conv.append(cv)
        if last_only:
            if lengths is None:
                x = x[:, -1:]
            else:
                x = x.gather(1, (lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, x.shape[-1]))
        logits = self.lm_head(self.norm(x))
        # Token counting is host-side bookkeeping; with padded rows the caller knows the count.
        n_tokens = state.n_tokens + (T if lengths is None else 0)
        new_state = RecurrentState(torch.stack(new_gla), torch.stack(new_conv), n_tokens)
        return logits, new_state


def build_model(config: LaplaceConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> LaplaceModel:
    """A freshly initialized model. On the meta device, nothing is allocated."""
    with torch.device(device):
        model = LaplaceModel(config)
    if str(device) != "meta":
        model.init_weights(seed)
    return model.to(dtype=dtype)
