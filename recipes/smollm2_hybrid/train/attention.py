"""Attention transfer's parts, shared by the training run (`transfer`) and the combine-mode
measurement (`measure/combine.py`): the teacher's per-layer inputs and targets, the branch's
output, and its error against full attention next to the window alone's.

The target of layer l is full attention's output on the teacher's own input to layer l; the
window's part (its numerator and denominator, the evicted keys, and the memory's share when
the layer keeps one) is computed once per sequence and only the branch is differentiated
(LoLCATs' first stage). `full_attention` is the fast form of the target (SDPA);
`layer_cache` computes it through the window path with W = T, the reference it is held to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import rope
from agent.runtime.state_spec import memory_spec
from agent.runtime.window import window_attention


@torch.no_grad()
def layer_inputs(teacher: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """The teacher's normed input to every layer's attention: [T, d_model] each."""
    seen: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: seen.append(args[0][0].clone())) for b in teacher.blocks]
    teacher(ids[None])
    for h in hooks:
        h.remove()
    return seen


@torch.no_grad()
def full_attention(attn: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The teacher's target from h [T, d_model]: full causal attention at true RoPE positions
    over the layer's own q, k, v (un-rotated from `_qkv`; GQA heads repeated as the window
    path groups them, query head h reads kv head h // R), before o_proj: [1, T, H, D] fp32."""
    c = attn.config
    q, k, v = attn._qkv(h[None])
    R = c.n_heads // c.kv_heads
    pos = torch.arange(h.shape[0])
    qr = rope(q.transpose(1, 2), pos, c.rope_theta)  # [1, H, T, D]
    kr = rope(k.transpose(1, 2), pos, c.rope_theta).repeat_interleave(R, 1)
    vr = v.transpose(1, 2).repeat_interleave(R, 1)
    return F.scaled_dot_product_attention(qr, kr, vr, is_causal=True).transpose(1, 2)


def fresh_memory(config: LaplaceConfig, slots: int) -> dict[str, torch.Tensor] | None:
    """An empty memory of `slots` slots for one sequence (all zeros, as a fresh state holds
    it: `state_spec.memory_spec`), or None for a layer that keeps none."""
    if not slots:
        return None
    return {n: torch.zeros(shape, dtype=getattr(torch, dtype)) for n, (shape, dtype) in memory_spec(config, 1, slots).items()}


@torch.no_grad()
def layer_cache(attn: torch.nn.Module, h: torch.Tensor, *, window: int | None = None, memory_slots: int = 0,
                target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """What the branch's training needs of one layer and sequence: the window's num/den, the
    evicted keys, q, the input (for the decay) and the target, full attention's output.

    window: the window to train at (default the layer's own); memory_slots: the layer's
    memory (`state_spec.memory_slots_of`; 0: none), empty at the start and run under the
    config's memory_policy, as `WindowAttention.forward` runs it from a fresh state. The
    "recall" policy scores with the branch, so its window part is not fixed: refused.
    target [1, T, H, D]: full attention's output when known (`full_attention`, a cache);
    otherwise computed here through the window path with W = T (slow: the reference)."""
    c = attn.config
    W = c.window if window is None else window
    if memory_slots and c.memory_policy == "recall":
        raise ValueError("the 'recall' memory scores with the branch: its window part cannot be computed once")
    q, k, v = attn._qkv(h[None])
    zeros = torch.zeros(1, c.kv_heads, c.sinks + W, c.head_k_dim)
    pos = torch.zeros(1, dtype=torch.long)
    num, den, _, _, ev_k, ev_v, ev_ok, _ = window_attention(
        q, k, v, zeros, zeros, pos, None, window=W, sinks=c.sinks, theta=c.rope_theta, block=c.chunk_size,
        memory=fresh_memory(c, memory_slots), memory_policy=c.memory_policy)
    if target is not None:
        return {"h": h[None], "q": q, "num": num, "den": den, "ev_k": ev_k, "ev_v": ev_v, "ev_ok": ev_ok, "target": target}
    T = h.shape[0]
    full = torch.zeros(1, c.kv_heads, c.sinks + T, c.head_k_dim)
    fnum, fden, *_ = window_attention(q, k, v, full, full, pos, None, window=T, sinks=c.sinks, theta=c.rope_theta, block=c.chunk_size)
    return {"h": h[None], "q": q, "num": num, "den": den, "ev_k": ev_k, "ev_v": ev_v, "ev_ok": ev_ok, "target": fnum / fden[..., None]}


def branch_output(attn: torch.nn.Module, cache: dict[str, torch.Tensor]) -> torch.Tensor:
    """The hybrid layer's attention output [1, T, H, D] from a fresh state (the module's own
    branch, with the window's part from the cache)."""
    c = attn.config
    state = torch.zeros(1, c.n_heads, c.feature_size, c.head_v_dim + 1)
    y, _ = attn.branch(cache["h"], cache["q"], cache["num"], cache["den"], cache["ev_k"], cache["ev_v"], cache["ev_ok"], None, state)
    return y


def window_errors(attn: torch.nn.Module, cache: dict[str, torch.Tensor], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(MSE of the hybrid layer's output to full attention's, the same MSE for the window
    alone), over the positions from `start` = S + W on, the only ones the branch changes.
    Their ratio is the relative MSE every report of this recipe gives: 1.0, the branch adds
    nothing; 0, the layer is full attention. Only the first carries a gradient."""
    target = cache["target"][:, start:]
    mse = F.mse_loss(branch_output(attn, cache)[:, start:], target)
    with torch.no_grad():
        base = F.mse_loss((cache["num"] / cache["den"][..., None])[:, start:], target)
    return mse, base
