"""Simple Gated Linear Attention as pure functions: `(q, k, v, g, initial_state) -> (o, final_state)`.

Shapes (the paper's notation):
    q, k: [B, T, H, K]    v: [B, T, H, V]    g: [B, T, H] (log-decay, <= 0)
    initial_state, final_state: [B, H, K, V] (always fp32)    o: [B, T, H, V] (dtype of v)

Recurrent form (the definition; `gla_naive` and `gla_step` implement it):

    S_t = exp(g_t) * S_(t-1) + k_t^T v_t
    o_t = (scale * q_t) S_t,     scale = K ** -0.5 unless given (Mamba-2 models use 1.0)

Chunked form (`gla_chunked`; prefill and training): within a chunk of C tokens let b be the
cumulative sum of g restarted at the chunk, b_L its last value. Then

    O_intra = ((scale * Q K^T) * M) V,   M_ij = exp(b_i - b_j) for j <= i, else 0
    O_inter = (scale * Q * exp(b)) S_prev
    S_next  = exp(b_L) S_prev + (K * exp(b_L - b))^T V

Every exponent above is <= 0. TRAP: factorizing M as (Q e^b)(K e^-b)^T overflows fp32 at
C = 128 for a head with a 1-token half-life (b reaches 128 ln 0.5 = -88.7), so M is built
by masking b_i - b_j *before* exponentiating. Decay sums and the state stay in fp32 whatever
the input dtype; the matmuls here also run in fp32 for exactness (the CPU has no fast bf16).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Tensor | None) -> tuple[int, int, int, int, int]:
    if q.dim() != 4 or q.shape != k.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got {tuple(q.shape)} and {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] matching q; got {tuple(v.shape)}")
    if g.shape != (B, T, H):
        raise ValueError(f"g must be [B, T, H]; got {tuple(g.shape)}")
    V = v.shape[-1]
    if initial_state is not None and initial_state.shape != (B, H, K, V):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}; got {tuple(initial_state.shape)}")
    return B, T, H, K, V


def _initial(initial_state: Tensor | None, B: int, H: int, K: int, V: int, device: torch.device) -> Tensor:
    if initial_state is None:
        return torch.zeros(B, H, K, V, dtype=torch.float32, device=device)
    return initial_state.float()


def gla_naive(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Tensor | None = None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """The deliberately slow reference: one token at a time, straight from the definition.
    It computes in fp32, or in fp64 when given fp64 inputs (a reference for precision tests)."""
    B, T, H, K, V = _check_shapes(q, k, v, g, initial_state)
    scale = K**-0.5 if scale is None else scale
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    S = _initial(initial_state, B, H, K, V, q.device).to(work)
    qf, kf, vf, gf = q.to(work), k.to(work), v.to(work), g.to(work)
    outs = []
    for t in range(T):
        S = gf[:, t, :, None, None].exp() * S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t] * scale, S))
    o = torch.stack(outs, dim=1) if outs else vf.new_zeros(B, 0, H, V)
    return o.to(v.dtype), S


def gla_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Tensor | None = None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """One decode step (T == 1) of the recurrent form; same signature as the others."""
    B, T, H, K, V = _check_shapes(q, k, v, g, initial_state)
    if T != 1:
        raise ValueError(f"gla_step takes exactly one token, got T={T}")
    S = _initial(initial_state, B, H, K, V, q.device)
    q1, k1, v1 = q[:, 0].float(), k[:, 0].float(), v[:, 0].float()
    S = g[:, 0, :, None, None].float().exp() * S + k1[..., :, None] * v1[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q1 * (K**-0.5 if scale is None else scale), S)
    return o[:, None].to(v.dtype), S


def gla_step_(q: Tensor, k: Tensor, v: Tensor, decay: Tensor, state: Tensor, scale: float | None = None) -> Tensor:
    """One decode step written into `state` in place: the lean form of `gla_step` for the
    decode loop (no new state tensor, no per-head copies of a shared key).

    q, k: [B, G, K], G groups each serving H / G consecutive value heads (G = H: one each)
    v: [B, H, V]    decay: [B, H] = exp(g)    state: [B, H, K, V] fp32, updated in place
    returns o: [B, H, V] fp32

        S <- decay * S + k^T v        o = (scale * q) S
    """
    B, G, K = q.shape
    H, V = v.shape[1], v.shape[2]
    f32 = lambda t: t if t.dtype == torch.float32 else t.float()  # noqa: E731  (no dispatch when it is)
    S = state.view(B, G, H // G, K, V)
    S.mul_(f32(decay).view(B, G, H // G, 1, 1))
    S.addcmul_(f32(k).view(B, G, 1, K, 1), f32(v).view(B, G, H // G, 1, V))
    scale = K**-0.5 if scale is None else scale
    qs = f32(q) if scale == 1.0 else f32(q) * scale
    return torch.matmul(qs.view(B, G, 1, 1, K), S).view(B, H, V)


def gla_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Tensor | None = None, chunk_size: int = 128,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked form. T need not be a multiple of `chunk_size`: the tail is padded with
    k = v = 0 and g = 0 (no write, no decay), which leaves the state exactly unchanged.
    The loop over chunks is plain Python over static shapes, so a compiler unrolls it."""
    B, T, H, K, V = _check_shapes(q, k, v, g, initial_state)
    C = max(1, min(chunk_size, T))  # a short input is one chunk of its own length, not padded to 128
    n_chunks = -(-T // C)
    pad = n_chunks * C - T
    # [B, T, H, D] -> [B, H, T, D] in fp32.
    qf = q.float().transpose(1, 2) * (K**-0.5 if scale is None else scale)
    kf = k.float().transpose(1, 2)
    vf = v.float().transpose(1, 2)
    gf = g.float().transpose(1, 2)
    if pad:
        qf = torch.nn.functional.pad(qf, (0, 0, 0, pad))
        kf = torch.nn.functional.pad(kf, (0, 0, 0, pad))
        vf = torch.nn.functional.pad(vf, (0, 0, 0, pad))
        gf = torch.nn.functional.pad(gf, (0, pad))
    S = _initial(initial_state, B, H, K, V, q.device)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    outs = []
    # The chunks as `split` views, not slices: a slice's backward writes its gradient into a
    # zeroed copy of the whole sequence, once per chunk (O(T^2 / C) of zero-filling, a third
    # of a training step at T = 2048); split's backward joins the chunks' gradients once.
    chunks = zip(*(x.split(C, dim=2) for x in (qf, kf, vf, gf)))
    for qc, kc, vc, gc in chunks:
        b = gc.cumsum(-1)  # [B, H, C], fp32, <= 0 and non-increasing
        decay = segment_sum(gc, causal).exp()  # M_ij = exp(b_i - b_j), zero above the diagonal
        o_intra = ((qc @ kc.transpose(-1, -2)) * decay) @ vc
        o_inter = (qc * b.exp()[..., None]) @ S
        outs.append(o_intra + o_inter)
        to_end = suffix_sum(gc)  # b_L - b_j, summed directly
        S = b[..., -1:].exp()[..., None] * S + (kc * to_end.exp()[..., None]).transpose(-1, -2) @ vc
    o = torch.cat(outs, dim=2)[:, :, :T].transpose(1, 2)
    return o.to(v.dtype), S


def segment_sum(g: Tensor, causal: Tensor) -> Tensor:
    """[..., C] -> [..., C, C]: out_ij = g_(j+1) + ... + g_i for j <= i, -inf above the diagonal.

    Each entry is summed from its own terms (a cumulative sum down a masked copy), not taken
    as the difference b_i - b_j of two long running sums: over a chunk of strong decays those
    sums reach hundreds, and their difference keeps only fp32's absolute precision at that
    size (transformers' Mamba-2 computes its `segsum` the same way)."""
    C = g.shape[-1]
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=g.device).tril(-1)  # [r, j]: r > j
    terms = g[..., :, None].expand(*g.shape, C).masked_fill(~strictly_lower, 0.0)  # [r, j] = g_r for r > j
    x = terms.cumsum(-2)  # [i, j] = sum of g_r for j < r <= i
    return x.masked_fill(~causal, float("-inf"))


def suffix_sum(g: Tensor) -> Tensor:
    """[..., C] -> [..., C]: out_j = g_(j+1) + ... + g_C, summed from the end (no differences)."""
    rev = g.flip(-1).cumsum(-1).flip(-1)  # g_j + ... + g_C
    return torch.nn.functional.pad(rev[..., 1:], (0, 1))
