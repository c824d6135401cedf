"""Layer parts shared by every token mixer: norms, the short conv, the GLU, padding masks
and the one call into the Simple-GLA kernel.

The mixers (`model.GLAAttention`, `ssd.SSDMixer`) are built from these; none of them
holds state: caches and GLA states go in and come out explicitly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.gla import gla_chunked, gla_step


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class GLU(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ShortConv(nn.Module):
    """Causal depthwise Conv1d of width W over `dim` channels, with a W-slot cache.

    The cache holds the last W inputs; the conv reads the last W - 1 of them plus the new
    token (the oldest slot is kept so the state matches the published 4-slot layout)."""

    def __init__(self, dim: int, width: int, bias: bool = False) -> None:
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.empty(dim, width))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor, cache: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        # x: [B, T, D]; cache: [B, D, W] fp32; lengths: [B] valid tokens per row or None.
        B, T, D = x.shape
        W = self.width
        ext = torch.cat([cache.to(x.dtype), x.transpose(1, 2)], dim=2)  # [B, D, W + T]
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = F.conv1d(ext[:, :, 1:], self.weight.to(x.dtype)[:, None, :], bias, groups=D)  # [B, D, T]
        if lengths is None:
            new_cache = ext[:, :, T:]
        else:  # the last W *valid* inputs of each row: ext positions [n, n + W)
            idx = (lengths.view(B, 1, 1) + torch.arange(W, device=x.device).view(1, 1, W)).expand(B, D, W)
            new_cache = ext.gather(2, idx)
        return y.transpose(1, 2), new_cache.float()


def conv_activation(config: LaplaceConfig, x: Tensor) -> Tensor:
    return F.silu(x) if config.conv_activation == "silu" else x


def mask_padding(k: Tensor, g: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
    """Padded positions write nothing (k = 0) and decay nothing (g = 0): the state after a
    padded row is exactly the state after its real tokens."""
    if lengths is None:
        return k, g
    T = k.shape[1]
    valid = torch.arange(T, device=k.device)[None, :] < lengths[:, None]  # [B, T]
    return k * valid[:, :, None, None].to(k.dtype), g * valid[:, :, None].to(g.dtype)


def run_gla(config: LaplaceConfig, q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One decode step or the chunked form, by length; the scale is the config's."""
    scale = None if config.qk_scale else 1.0
    if q.shape[1] == 1:
        return gla_step(q, k, v, g, state, scale=scale)
    return gla_chunked(q, k, v, g, state, config.chunk_size, scale=scale)


def gated_rmsnorm(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """RMSNorm over `groups` equal slices of y * silu(z), then the weight (Mamba-2's
    norm_before_gate=False form), computed in fp32."""
    h = y.float() * F.silu(z.float())
    *lead, width = h.shape
    hg = h.view(*lead, groups, width // groups)
    hg = hg * torch.rsqrt(hg.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * hg.view(*lead, width)).to(y.dtype)
