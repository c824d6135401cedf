"""The token-mixer interface, the Laplace GLA mixer, and the table of mixers by name.

Every mixer (`GLAAttention` below, `ssd.SSDMixer`, `window.WindowAttention`) is an
nn.Module with the same surface, in the manner of flash-linear-attention's layers, so
`Block` and `LaplaceModel` never ask which one they hold:

    state_spec(config, batch) -> {name: (shape, dtype)}   the per-layer state it declares
                                                          (batch at dim 0; fp32 or int64)
    uses_positions: bool                                  whether it reads `pos` (then the
                                                          model's state carries positions)
    forward(x [B, T, d], state, lengths, pos) -> (y [B, T, d], new state)
    step_(x [B, d], state, pos) -> y [B, d]               one token, `state` written in place
    resting_log_decay() -> [H]                            g with the input term left out
    init_weights(gen, std, out_std, ffn)                  its own parameters' draws
    decay_tap                                             an nn.Identity its decays pass through

`state` is a dict of this layer's tensors (views into the stacked state); `lengths` [B] the
real tokens per row (None: all); `pos` [B] int64 the tokens each row read before this
call, or None when no mixer of the model uses positions. `forward` never changes its
input state; `step_` is tested against `forward` token by token.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, recurrent_state_spec, RMSNorm, ShortConv, StateSpec, conv_activation, mask_padding, run_gla, run_gla_step_
from agent.runtime.ssd import SSDMixer
from agent.runtime.window import WindowAttention


class GLAAttention(nn.Module):
    """conv + SiLU -> q, k, v and a per-head scalar decay -> Simple GLA -> head norm -> gate -> o."""

    uses_positions: ClassVar[bool] = False

    @staticmethod
    def state_spec(config: LaplaceConfig, batch: int) -> StateSpec:
        return recurrent_state_spec(config, batch)

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.conv = ShortConv(c.d_model, c.conv_size, bias=c.conv_bias)
        self.q_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.value_dim, bias=False)
        self.gate_proj = nn.Linear(c.d_model, c.value_dim, bias=False)  # output gate
        self.o_proj = nn.Linear(c.value_dim, c.d_model, bias=False)
        # Per-head scalar decay gate, grouped: head h reads its own d_model / H channels.
        self.decay_weight = nn.Parameter(torch.zeros(c.n_heads, c.d_model // c.n_heads))
        self.decay_bias = nn.Parameter(torch.zeros(c.n_heads))
        self.head_norm = RMSNorm(c.head_v_dim, c.norm_eps)
        self.decay_tap = nn.Identity()  # g passes through it, so probes can hook the decays

    def log_decay(self, c: Tensor) -> Tensor:
        """g = logsigmoid(w x + b) / normalizer, per head: [B, T, D] -> [B, T, H] fp32."""
        B, T, _ = c.shape
        H = self.config.n_heads
        pre = torch.einsum("bthd,hd->bth", c.float().view(B, T, H, -1), self.decay_weight.float())
        return F.logsigmoid(pre + self.decay_bias.float()) / self.config.gate_normalizer

    def resting_log_decay(self) -> Tensor:
        """g per head with the input term left out: [H]."""
        return F.logsigmoid(self.decay_bias.detach().float()) / self.config.gate_normalizer

    def forward(self, x: Tensor, state: dict[str, Tensor], lengths: Tensor | None, pos: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        cfg = self.config
        B, T, _ = x.shape
        c, conv_state = self.conv(x, state["conv"], lengths)
        c = conv_activation(cfg, c)
        q = self.q_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        k = self.k_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        v = self.v_proj(c).view(B, T, cfg.n_heads, cfg.head_v_dim)
        g = self.decay_tap(self.log_decay(c))
        k, g = mask_padding(k, g, lengths)
        o, gla_state = run_gla(cfg, q, k, v, g, state["gla"])
        o = self.head_norm(o).reshape(B, T, cfg.value_dim)
        o = o * F.silu(self.gate_proj(x))
        return self.o_proj(o), {"gla": gla_state, "conv": conv_state}

    def step_(self, x: Tensor, state: dict[str, Tensor], pos: Tensor | None) -> Tensor:
        """One decode token, both states updated in place: x [B, d_model] -> [B, d_model]."""
        cfg = self.config
        B = x.shape[0]
        H = cfg.n_heads
        c = conv_activation(cfg, self.conv.step_(x, state["conv"]))
        q = self.q_proj(c).view(B, H, cfg.head_k_dim)
        k = self.k_proj(c).view(B, H, cfg.head_k_dim)
        v = self.v_proj(c).view(B, H, cfg.head_v_dim)
        g = self.decay_tap(self.log_decay(c[:, None]))[:, 0]
        o = run_gla_step_(cfg, q, k, v, g, state["gla"]).to(x.dtype)
        o = self.head_norm(o).reshape(B, cfg.value_dim)
        o = o * F.silu(self.gate_proj(x))
        return self.o_proj(o)

    @torch.no_grad()
    def init_weights(self, gen: torch.Generator, std: float, out_std: float, ffn: GLU | None) -> None:
        """Normal matrices, the half-life schedule's decay biases with zero decay weights (so
        the schedule is exact). The block's GLU is drawn among these: the order of draws is
        the one the bundled model's recipe was trained from."""
        c = self.config
        glu = (ffn.w1, ffn.w3) if ffn is not None else ()
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, *glu):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
        for lin in (self.o_proj, *((ffn.w2,) if ffn is not None else ())):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * out_std)
        self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen) / math.sqrt(c.conv_size))
        if self.conv.bias is not None:
            self.conv.bias.zero_()
        self.decay_weight.zero_()
        self.decay_bias.copy_(torch.tensor(c.gate_biases()))
        self.head_norm.weight.fill_(1.0)


MIXERS: dict[str, type[nn.Module]] = {"gla": GLAAttention, "ssd": SSDMixer, "window": WindowAttention}
