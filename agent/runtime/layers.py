"""Layer parts shared by every token mixer: norms, the short conv, the GLU, padding masks,
rotary positions and the one call into the Simple-GLA kernel.

The mixers (`mixers.GLAAttention`, `ssd.SSDMixer`, `window.WindowAttention`) are built
from these; none of them holds state: caches and GLA states go in and come out explicitly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.gla import gla_chunked, gla_step, gla_step_
from agent.runtime.quant import Int8Linear, fuse_int8_
from agent.runtime.state_spec import StateSpec




def recurrent_state_spec(config: LaplaceConfig, batch: int) -> StateSpec:
    """The state of a conv + GLA-style mixer (gla and ssd): the [B, H, K, V] matrix state and
    the short conv's [B, conv_dim, W] cache, both fp32 whatever the weights' dtype."""
    c = config
    return {"gla": ((batch, c.n_heads, c.head_k_dim, c.head_v_dim), "float32"),
            "conv": ((batch, c.conv_dim, c.conv_size), "float32")}


def f32(t: Tensor) -> Tensor:
    """`t` as fp32, with no dispatch when it already is (a decode step makes many such calls)."""
    return t if t.dtype == torch.float32 else t.float()


def rope_cos_sin(positions: Tensor, dim: int, theta: float, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """(cos, sin) [..., dim] of rotary angles at `positions` [...], as Hugging Face Llama
    builds them: inverse frequencies in fp32, angles and their cos/sin in `dtype`, each
    half of the channels repeated (the rotate-half layout). A table of these, looked up by
    position, gives bit for bit what `rope` computes from the positions."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))
    ang = positions.to(dtype)[..., None] * inv.to(dtype)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    D = x.shape[-1]
    return torch.cat([-x[..., D // 2 :], x[..., : D // 2]], dim=-1)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate x [..., N, D] to positions [..., N] (broadcast against x's leading dims) in
    x's dtype: the one RoPE of the runtime (the window mixer, its float64 reference and
    the softmax baseline). A negative position rotates back: rope(rope(x, p), -p) ~= x."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta, x.dtype)
    return x * cos + rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight in fp32, as one op (the same numbers as spelling it out).
        y = F.rms_norm(f32(x), (x.shape[-1],), f32(self.weight), self.eps)
        return y if y.dtype == x.dtype else y.to(x.dtype)


def fuse_linears_(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Store the weights of `owner`'s plain, bias-free Linears `names` as one matrix (rows in
    that order) and make each Linear's weight a view of its rows: the same values and
    parameter names, no extra memory, and `project` then runs them as one matmul. For
    inference (`checkpoint` does it for decode-layout loads); False if they cannot be fused.
    int8 ones (`quant.Int8Linear`, bias-free) fuse the same way, their scales too."""
    mods = [getattr(owner, n, None) for n in names]
    if all(type(m) is Int8Linear and m.bias is None for m in mods):
        return fuse_int8_(owner, names, mods)  # type: ignore[arg-type]
    if not all(type(m) is nn.Linear and m.bias is None for m in mods):
        return False
    ws = [m.weight for m in mods]  # type: ignore[union-attr]
    if len({(w.dtype, w.device, w.shape[1]) for w in ws}) != 1 or any(w.is_meta for w in ws):
        return False
    adopt_fused_(owner, names, torch.cat([w.detach() for w in ws]))
    return True


def adopt_fused_(owner: nn.Module, names: tuple[str, ...], fused: Tensor) -> None:
    """Make `owner`'s bias-free Linears `names` views of consecutive rows of `fused` (their
    weights' values stacked in that order: a copy `fuse_linears_` made, or the matrix a
    load read them into) and record the group for `project`."""
    mods = [getattr(owner, n) for n in names]
    rows, start = [], 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + n], requires_grad=m.weight.requires_grad)
        rows.append(n)
        start += n
    if start != fused.shape[0]:
        raise ValueError(f"{names} hold {start} rows, the fused matrix {fused.shape[0]}")
    # The views' addresses: a weight later replaced or moved (.to) no longer matches them.
    ptrs = [m.weight.data_ptr() for m in mods]
    owner.__dict__.setdefault("_fused", {})[names] = (fused, mods, ptrs, rows)


def fused_group(owner: nn.Module, names: tuple[str, ...]) -> tuple[Tensor | Int8Linear, list[int]] | None:
    """(the fused matrix or Int8Linear, each projection's rows) where `fuse_linears_` fused
    `names` and they are still those Linears with those weights; None otherwise (never
    fused, or a LoRA wrapper or a replaced weight since)."""
    entry = owner.__dict__.get("_fused", {}).get(names)
    if entry is None:
        return None
    fused, mods, ptrs, rows = entry
    if all(getattr(owner, n) is m and m.weight.data_ptr() == p for n, m, p in zip(names, mods, ptrs)):
        return fused, rows
    return None


def project(owner: nn.Module, names: tuple[str, ...], x: Tensor) -> list[Tensor]:
    """[getattr(owner, n)(x) for n in names], as one matmul where they are fused
    (`fused_group`), else the separate calls."""
    group = fused_group(owner, names)
    if group is not None:
        fused, rows = group
        y = fused(x) if isinstance(fused, Int8Linear) else F.linear(x, fused)
        return list(y.split(rows, -1))
    return [getattr(owner, n)(x) for n in names]


class GLU(nn.Module):
    FUSED = ("w1", "w3")  # gate and up: one matmul when fused for inference

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = project(self, self.FUSED, x)
        return self.w2(F.silu(gate) * up)


@torch.no_grad()
def init_ffn(ffn: GLU | None, gen: torch.Generator, std: float, out_std: float) -> None:
    """The block's GLU, drawn before the mixer's own weights (the ssd and window order)."""
    if ffn is None:
        return
    for lin, s in ((ffn.w1, std), (ffn.w3, std), (ffn.w2, out_std)):
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * s)


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

    def step_(self, x: Tensor, cache: Tensor) -> Tensor:
        """One token through the conv, its cache updated in place: x [B, D] -> y [B, D].

        A multiply-add over the W slots rather than a convolution call (which costs far
        more than the arithmetic at T = 1); the same slots and order as `forward`."""
        ext = torch.cat([cache[:, :, 1:], f32(x).unsqueeze(2)], dim=2)  # [B, D, W]: the cache after this token
        cache.copy_(ext)
        y = (ext * f32(self.weight)).sum(-1)
        if self.bias is not None:
            y = y + f32(self.bias)
        return y if y.dtype == x.dtype else y.to(x.dtype)


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


# The chunked form is exact for any chunk, so on a CPU the kernel's chunk is capped: its
# [H, C, C] decay masks grow with C^2, and at Mamba-2's C = 256 one layer's 512-token
# prefill took 118 ms against 21 ms at C = 64 (24 heads of 128 x 64, one thread, same
# run). Accelerators keep the config's chunk (Trainium's is sized to its on-chip buffer);
# segments and compiled buckets are multiples of the config's chunk either way.
CPU_KERNEL_CHUNK = 64


def run_gla(config: LaplaceConfig, q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One decode step or the chunked form, by length; the scale is the config's."""
    scale = None if config.qk_scale else 1.0
    if q.shape[1] == 1:
        return gla_step(q, k, v, g, state, scale=scale)
    chunk = min(config.chunk_size, CPU_KERNEL_CHUNK) if q.device.type == "cpu" else config.chunk_size
    return gla_chunked(q, k, v, g, state, chunk, scale=scale)


def run_gla_step_(config: LaplaceConfig, q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor) -> Tensor:
    """`gla_step_` with the config's scale: q, k [B, G, K], v [B, H, V], g [B, H] -> o [B, H, V]."""
    return gla_step_(q, k, v, g.exp(), state, scale=None if config.qk_scale else 1.0)


def gated_rmsnorm(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """RMSNorm over `groups` equal slices of y * silu(z), then the weight (Mamba-2's
    norm_before_gate=False form), computed in fp32."""
    h = f32(y) * F.silu(f32(z))
    *lead, width = h.shape
    hg = F.rms_norm(h.view(*lead, groups, width // groups), (width // groups,), None, eps)
    out = f32(weight) * hg.view(*lead, width)
    return out if out.dtype == y.dtype else out.to(y.dtype)
