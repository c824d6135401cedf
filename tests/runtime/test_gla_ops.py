"""Chunked == recurrent == naive on outputs, final state and gradients, over a grid."""

from __future__ import annotations

import math

import pytest
import torch

from agent.runtime.gla import gla_chunked, gla_naive, gla_step


def make_inputs(B, T, H, K, V, half_lives, dtype=torch.float32, seed=0, with_state=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen).to(dtype)
    k = torch.randn(B, T, H, K, generator=gen).to(dtype) / math.sqrt(K)
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    base = torch.tensor([-math.log(2.0) / h for h in half_lives])  # per-head log decay
    jitter = 1 + 0.5 * torch.rand(B, T, H, generator=gen)  # data-dependent, still <= 0
    g = (base * jitter).to(dtype)
    s0 = torch.randn(B, H, K, V, generator=gen) if with_state else None
    return q, k, v, g, s0


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


GRID = [
    pytest.param(2, 37, 2, 8, 16, (1.0, 64.0), 16, id="tiny-uneven-T"),
    pytest.param(1, 130, 4, 16, 32, (1.0, 8.0, 256.0, 2048.0), 32, id="T130-chunk32"),
    pytest.param(1, 256, 2, 96, 192, (1.0, 2048.0), 128, id="3b-head-chunk128"),
    pytest.param(1, 300, 16, 96, 192, tuple(2048 ** (h / 15) for h in range(16)), 128, id="3b-16-heads-schedule"),
]


@pytest.mark.parametrize("B,T,H,K,V,half_lives,chunk", GRID)
def test_chunked_matches_naive_fp32(B, T, H, K, V, half_lives, chunk):
    q, k, v, g, s0 = make_inputs(B, T, H, K, V, half_lives)
    o_ref, s_ref = gla_naive(q, k, v, g, s0)
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=chunk)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


@pytest.mark.parametrize("B,T,H,K,V,half_lives,chunk", GRID[:3])
def test_step_by_step_matches_naive(B, T, H, K, V, half_lives, chunk):
    q, k, v, g, s0 = make_inputs(B, T, H, K, V, half_lives)
    o_ref, s_ref = gla_naive(q, k, v, g, s0)
    s, outs = s0, []
    for t in range(T):
        o_t, s = gla_step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1], s)
        outs.append(o_t)
    assert rel_err(torch.cat(outs, 1), o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


@pytest.mark.parametrize("B,T,H,K,V,half_lives,chunk", GRID[:3])
def test_gradients_match_naive(B, T, H, K, V, half_lives, chunk):
    inputs = make_inputs(B, T, H, K, V, half_lives)
    grads = []
    for fn in (gla_naive, lambda *a: gla_chunked(*a, chunk_size=chunk)):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        o, s = fn(*leaves)
        gen = torch.Generator().manual_seed(1)
        loss = (o * torch.randn(o.shape, generator=gen)).sum() + (s * torch.randn(s.shape, generator=gen)).sum()
        loss.backward()
        grads.append([t.grad for t in leaves])
    for name, g_ref, g_fast in zip("qkvgS", grads[0], grads[1]):
        assert rel_err(g_fast, g_ref) < 1e-5, name


def test_fast_head_does_not_overflow_at_chunk_128():
    """A 1-token half-life head sums to 128 ln 0.5 = -88.7 inside a chunk: the factorized
    (Q e^b)(K e^-b)^T form would hit e^88.7 = inf. Even a far faster decay stays finite."""
    q, k, v, _, s0 = make_inputs(1, 256, 2, 96, 192, (1.0, 1.0))
    g = torch.full((1, 256, 2), -math.log(2.0))
    g[..., 1] = -5.0  # in-chunk sum -640
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=128)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    o_ref, s_ref = gla_naive(q, k, v, g, s0)
    assert rel_err(o, o_ref) < 1e-5


def test_bf16_inputs_keep_fp32_state():
    q, k, v, g, s0 = make_inputs(1, 200, 4, 16, 32, (1.0, 16.0, 256.0, 2048.0), dtype=torch.bfloat16)
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=64)
    o_ref, s_ref = gla_naive(q, k, v, g, s0)
    assert s.dtype == torch.float32 and o.dtype == torch.bfloat16
    assert rel_err(s, s_ref) < 1e-5  # same fp32 math on the same (bf16-valued) inputs
    assert rel_err(o, o_ref) < 1e-2  # output rounded to bf16


def test_padding_tail_leaves_state_unchanged():
    """T not a multiple of the chunk: the padded tail must not write or decay the state."""
    q, k, v, g, s0 = make_inputs(1, 20, 2, 8, 8, (1.0, 4.0))
    _, s_a = gla_chunked(q, k, v, g, s0, chunk_size=16)
    _, s_b = gla_chunked(q, k, v, g, s0, chunk_size=64)
    assert rel_err(s_a, s_b) < 1e-6


def test_shape_errors_are_clear():
    q, k, v, g, s0 = make_inputs(1, 4, 2, 8, 8, (1.0, 4.0))
    with pytest.raises(ValueError, match="initial_state"):
        gla_chunked(q, k, v, g, s0[:, :1])
    with pytest.raises(ValueError, match="exactly one token"):
        gla_step(q, k, v, g, s0)


@pytest.mark.parametrize("scale", [1.0, 0.3], ids=["mamba2-no-scale", "other-scale"])
def test_explicit_scale_and_mamba_sized_decays(scale):
    """Mamba-2 checkpoints use no 1/sqrt(K) scale and decays down to -20 per token (a
    128-token chunk sums to -2560): all three forms still agree, and nothing overflows."""
    q, k, v, g, s0 = make_inputs(1, 200, 3, 16, 8, (1.0, 4.0, 512.0))
    g = g * torch.tensor([30.0, 1.0, 1.0])  # head 0: about -20 per token
    o_ref, s_ref = gla_naive(q, k, v, g, s0, scale=scale)
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=128, scale=scale)
    assert torch.isfinite(o).all() and rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5
    o1, _ = gla_step(q[:, :1], k[:, :1], v[:, :1], g[:, :1], s0, scale=scale)
    assert rel_err(o1, o_ref[:, :1]) < 1e-5
    o_default, _ = gla_naive(q, k, v, g, s0)
    assert rel_err(o_default, o_ref) > 0.1  # the scale argument is really used


def test_chunked_is_as_precise_as_decode_at_strong_decays():
    """Against an fp64 reference, a 256-token chunk of strong decays must not lose precision
    by taking differences of long running sums (b_i - b_j): its error stays within a few
    times the token-by-token path's (issue 31: 1.2e-3 against 7e-5 before segment sums)."""
    gen = torch.Generator().manual_seed(7)
    B, T, H, K, V = 1, 300, 4, 32, 32
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * 2
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64) * 4
    # Decays of Mamba-2 strength: running sums reach several hundred within a chunk.
    g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64) * 4.0
    o64, s64 = gla_naive(q, k, v, g, scale=1.0)
    assert o64.dtype == torch.float64  # the reference really is fp64
    f32 = [t.float() for t in (q, k, v, g)]
    o_chunk, s_chunk = gla_chunked(*f32, chunk_size=256, scale=1.0)
    state, outs = None, []
    for t in range(T):
        o1, state = gla_step(*(x[:, t : t + 1] for x in f32), state, scale=1.0)
        outs.append(o1)
    o_step = torch.cat(outs, dim=1)
    err_chunk = (o_chunk.double() - o64).abs().max().item()
    err_step = (o_step.double() - o64).abs().max().item()
    assert err_chunk <= 4 * err_step + 1e-6, (err_chunk, err_step)
    assert (s_chunk.double() - s64).abs().max().item() <= 4 * (state.double() - s64).abs().max().item() + 1e-6
