"""The Mamba-2 mixer family (Llamba, Mamba2ForCausalLM) on the shared Simple-GLA kernel.

A Mamba-2 layer is Simple GLA with a scalar decay per head written in other words. Per
layer, with H value heads of width V, G q/k groups of width K (K = d_state):

    z, xBC, a = in_proj(u)                       (one matrix; rows in that order)
    x, B, C   = act(conv(xBC))                   (causal depthwise conv, width W)
    dt        = softplus(a + dt_bias)            ([B, T, H]; clamped to [dt_min, dt_max])
    g         = -exp(A_log) * dt                 (log-decay, <= 0)
    k, q      = B, C of head h's group           (group h // (H / G); no 1/sqrt(K) scale)
    v         = x * dt  (Mamba-2)  or  x  (Llamba's discrete form)
    o, S      = gla(q, k, v, g, S)               (the same kernel as the Laplace mixer)
    y         = o + D * x
    out       = out_proj(y * silu(z + z_bias))                (gate "silu": Llamba)
             or out_proj(rmsnorm_groups(y * silu(z)) * w)     (gate "rmsnorm": Mamba-2)

Llamba is this with A_log = 0 and dt_bias = 0 (its decay is -softplus(a)), which the
importer writes explicitly, so there is one decay formula for the whole family.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, recurrent_state_spec, ShortConv, StateSpec, conv_activation, f32, gated_rmsnorm, init_ffn, mask_padding, run_gla, run_gla_step_


class SSDMixer(nn.Module):
    """See the module docstring and `mixers.py` (the interface). State: gla [B, H, K, V],
    conv [B, conv_dim, W]; no positions."""

    uses_positions: ClassVar[bool] = False

    @staticmethod
    def state_spec(config: LaplaceConfig, batch: int) -> StateSpec:
        return recurrent_state_spec(config, batch)

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.in_proj = nn.Linear(c.d_model, c.in_proj_dim(), bias=c.proj_bias)
        self.conv = ShortConv(c.conv_dim, c.conv_size, bias=c.conv_bias)
        self.A_log = nn.Parameter(torch.zeros(c.n_heads))
        self.dt_bias = nn.Parameter(torch.zeros(c.n_heads))
        self.D = nn.Parameter(torch.ones(c.n_heads)) if c.d_skip else None
        # "silu" gate: a bias on z; "rmsnorm" gate: the norm's weight. Either is [value_dim].
        if c.gate == "silu":
            self.z_bias = nn.Parameter(torch.zeros(c.value_dim))
        else:
            self.norm_weight = nn.Parameter(torch.ones(c.value_dim))
        self.out_proj = nn.Linear(c.value_dim, c.d_model, bias=c.proj_bias)
        self.decay_tap = nn.Identity()  # g passes through it, so probes can hook the decays

    def log_decay(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """(g, dt): dt = softplus(a + dt_bias) clamped, g = -exp(A_log) * dt; [B, T, H] fp32 each."""
        c = self.config
        dt = F.softplus(f32(a) + f32(self.dt_bias))
        if c.dt_min > 0.0 or c.dt_max is not None:
            dt = dt.clamp(min=c.dt_min, max=c.dt_max)
        return -torch.exp(f32(self.A_log)) * dt, dt

    def resting_log_decay(self) -> Tensor:
        """g per head at a = 0 (the decay input's resting value): [H]."""
        return self.log_decay(torch.zeros(1, 1, self.config.n_heads, device=self.A_log.device))[0][0, 0]

    def forward(self, u: Tensor, state: dict[str, Tensor], lengths: Tensor | None, pos: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        c = self.config
        Bsz, T, _ = u.shape
        H, G, K, V = c.n_heads, c.qk_heads, c.head_k_dim, c.head_v_dim
        z, xbc, a = self.in_proj(u).split([c.value_dim, c.conv_dim, H], dim=-1)
        xbc, conv_state = self.conv(xbc, state["conv"], lengths)
        xbc = conv_activation(c, xbc)
        x, b, cq = xbc.split([c.value_dim, c.key_dim, c.key_dim], dim=-1)
        x = x.reshape(Bsz, T, H, V)
        # Each group's B and C serve H / G consecutive value heads.
        k = b.reshape(Bsz, T, G, K).repeat_interleave(H // G, dim=2)
        q = cq.reshape(Bsz, T, G, K).repeat_interleave(H // G, dim=2)
        g, dt = self.log_decay(a)
        g = self.decay_tap(g)
        v = x * dt[..., None].to(x.dtype) if c.v_times_dt else x
        k, g = mask_padding(k, g, lengths)
        o, gla_state = run_gla(c, q, k, v, g, state["gla"])
        if self.D is not None:
            o = o + x * self.D.to(x.dtype)[:, None]
        y = o.reshape(Bsz, T, c.value_dim)
        if c.gate == "silu":
            y = y * F.silu(z + self.z_bias.to(z.dtype))
        else:
            y = gated_rmsnorm(y, z, self.norm_weight, c.norm_groups, c.norm_eps)
        return self.out_proj(y), {"gla": gla_state, "conv": conv_state}

    def step_(self, u: Tensor, state: dict[str, Tensor], pos: Tensor | None) -> Tensor:
        """One decode token, both states updated in place: u [B, d_model] -> [B, d_model].
        The same math as `forward` at T = 1 (tested against it), in fewer, larger ops."""
        c = self.config
        Bsz = u.shape[0]
        H, G, K, V = c.n_heads, c.qk_heads, c.head_k_dim, c.head_v_dim
        z, xbc, a = self.in_proj(u).split([c.value_dim, c.conv_dim, H], dim=-1)
        xbc = conv_activation(c, self.conv.step_(xbc, state["conv"]))
        x, b, cq = xbc.split([c.value_dim, c.key_dim, c.key_dim], dim=-1)
        g, dt = self.log_decay(a)
        g = self.decay_tap(g[:, None])[:, 0]  # hooks see [B, T, H], as from forward
        x = x.reshape(Bsz, H, V)
        v = x * (dt if x.dtype == torch.float32 else dt.to(x.dtype)).unsqueeze(-1) if c.v_times_dt else x
        o = run_gla_step_(c, cq.reshape(Bsz, G, K), b.reshape(Bsz, G, K), v, g, state["gla"])
        o = o if o.dtype == x.dtype else o.to(x.dtype)
        if self.D is not None:
            o = torch.addcmul(o, x, (self.D if x.dtype == self.D.dtype else self.D.to(x.dtype)).unsqueeze(-1))
        y = o.reshape(Bsz, c.value_dim)
        if c.gate == "silu":
            y = y * F.silu(z + self.z_bias.to(z.dtype))
        else:
            y = gated_rmsnorm(y, z, self.norm_weight, c.norm_groups, c.norm_eps)
        return self.out_proj(y)

    @torch.no_grad()
    def init_weights(self, gen: torch.Generator, std: float, out_std: float, ffn: GLU | None) -> None:
        """The block's GLU, then Mamba-2's usual init: dt in [1e-3, 1e-1] log-uniform, A in [1, 16]."""
        c = self.config
        init_ffn(ffn, gen, std, out_std)
        self.in_proj.weight.copy_(torch.randn(self.in_proj.weight.shape, generator=gen) * std)
        self.out_proj.weight.copy_(torch.randn(self.out_proj.weight.shape, generator=gen) * out_std)
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                lin.bias.zero_()
        self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen) / math.sqrt(c.conv_size))
        if self.conv.bias is not None:
            self.conv.bias.zero_()
        u = torch.rand(c.n_heads, generator=gen)
        dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log.copy_(torch.log(1 + 15 * torch.rand(c.n_heads, generator=gen)))
        if self.D is not None:
            self.D.fill_(1.0)
        if c.gate == "silu":
            self.z_bias.zero_()
        else:
            self.norm_weight.fill_(1.0)
