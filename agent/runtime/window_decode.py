"""The window mixer's lean decode step: one token, the layer's state written in place.

The ring's layout (`ring_slot`) lives here, beside the step; `window.py` holds the rest of
the math. The same math as `window.WindowAttention.forward` at T = 1 (tested against it token by
token), in the fewest ops a step can take:

- the new key is rotated once, to its ring slot's angle, and written into its slot (one
  copy; the ring is never reordered or copied, and no stored key is rotated again);
- the query is rotated to the three angles a step needs (sinks: min(t, S + W - 1); window
  keys of t's epoch: slot(t); of the epoch before: slot(t) + W) and scored against the
  whole ring in one matmul; a gather picks each slot's angle and an additive mask hides
  the slots that hold no key in the window;
- the GLA branch (if on) takes the key leaving the ring (the slot's old content, rotated
  back) and steps the Simple-GLA state in place (`gla.gla_step_`'s update, written here
  with the appended ones column as a separate add rather than a concatenated value);
- the memory (if on) scores the leaving key ("novelty" against the ring's window slots
  rotated back with a per-slot table, those within `memory.NOVELTY_SPAN` after the leaving
  token masked by another), admits it (`memory.admit`) and is read at one angle (W unless
  the config's `memory_distance`, or for the rest group `memory_rest_distance`, says
  otherwise: `attn.memory_at`).

Everything that depends on the position alone (cos/sin of the angles, the per-slot angle
choice and mask) is tabulated once per (S, W, D, theta, device) for the S + 2W distinct
"canonical" positions: past S + W a step at t behaves as at t - W, so the tables cover
every session length. A table row equals what `layers.rope` computes (same formula).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agent.runtime import native
from agent.runtime.layers import f32, project, rope_cos_sin
from agent.runtime.memory import EMPTY, MEMORY_NAMES, NOVELTY_SPAN, TWIN, admit, novelty, recall_error
from agent.runtime.state_spec import MEMORY_GROUPS


GATED_EPS = 1e-6  # the gated branch's normaliser guard (z is 0 before any key was evicted)


def ring_slot(p: Tensor, sinks: int, window: int) -> Tensor:
    """The ring slot of position p (int64, any shape): p for a sink, else S + (p - S) mod W.
    It is also the angle the key at p is stored rotated to."""
    return torch.where(p < sinks, p, sinks + torch.remainder(p - sinks, window))


@dataclass(frozen=True)
class StepTables:
    """cos3, sin3 [N, 3, D]: the three angles (sinks, lo, hi) of canonical position c (sin
    signed for the roll form of rotate-half); row [N, S + W] int64: which of the three each
    slot is scored with; bias [N, S + W]: 0 or -inf (no key in the window there)."""

    cos3: Tensor
    sin3: Tensor
    row: Tensor
    bias: Tensor
    cos_mem: Tensor  # [D]: the angle the query reads the memory's un-rotated keys at (`LaplaceConfig.memory_read_at`)
    sin_mem: Tensor
    cos_ring: Tensor  # [W, D]: the window slots' angles S .. S + W - 1 (to rotate their keys back)
    sin_ring: Tensor
    twin: Tensor  # [N, W] bool: window slot S + j may hold a twin of the token leaving at c ("novelty")
    mem_tab: Tensor  # [2 + 2W, D]: cos_mem, sin_mem, cos_ring, sin_ring stacked (`native`'s memory kernel reads them so)


_TABLES: dict[tuple, StepTables] = {}


def canonical(t: int, sinks: int, window: int) -> int:
    """The table row of position t: t itself below S + W, else S + W + (t - S) mod W."""
    return t if t < sinks + window else sinks + window + (t - sinks) % window


def step_tables(sinks: int, window: int, dim: int, theta: float, device: torch.device, memory_at: int | None = None) -> StepTables:
    """The decode step's constant tables (see `StepTables`); the memory is read at angle
    `memory_at` (None: W)."""
    key = (sinks, window, dim, theta, str(device), memory_at)
    if key not in _TABLES:
        S, W = sinks, window
        t = torch.arange(S + 2 * W, device=device)[:, None]  # canonical row c stands for t = c
        slot_t = ring_slot(t, S, W)
        angles = torch.cat([t.clamp(max=S + W - 1), slot_t, slot_t + W], 1)  # [N, 3]
        cos, sin = rope_cos_sin(angles, dim, theta)
        sign = torch.cat([-torch.ones(dim // 2, device=device), torch.ones(dim // 2, device=device)])
        s = torch.arange(S + W, device=device)[None, :]
        sink = s < S
        p = torch.where(s <= slot_t, t - (slot_t - s), t - (slot_t - s) - W)  # the position in slot s after t's write
        valid = torch.where(sink, s <= t, p >= S)
        row = torch.where(sink, 0, torch.where(s <= slot_t, 1, 2))
        bias = torch.zeros(valid.shape, device=device).masked_fill(~valid, float("-inf"))
        cos_m, sin_m = rope_cos_sin(torch.full((1,), W if memory_at is None else memory_at, device=device), dim, theta)
        cos_r, sin_r = rope_cos_sin(torch.arange(S, S + W, device=device), dim, theta)
        # After t's write, window slot S + j holds t - d with d = (slot(t) - S - j) mod W; the
        # token leaving is t - W, so the slot is past the span after it iff W - d > span.
        d = torch.remainder(slot_t - S - torch.arange(W, device=device)[None, :], W)
        twin = W - d > NOVELTY_SPAN
        mem_tab = torch.cat([cos_m, sin_m * sign, cos_r, sin_r * sign]).contiguous()
        _TABLES[key] = StepTables(cos.contiguous(), (sin * sign).contiguous(), row, bias, cos_m[0], sin_m[0] * sign, cos_r,
                                  sin_r * sign, twin, mem_tab)
    return _TABLES[key]


def _rows(table: Tensor, cs: list[int]) -> Tensor:
    """table[cs] with a leading batch dim: a view for one row, a gather for several."""
    if len(cs) == 1:
        return table[cs[0] : cs[0] + 1]
    return table.index_select(0, torch.tensor(cs, device=table.device))


def window_step_(attn: Any, x: Tensor, state: dict[str, Tensor], pos: Tensor) -> Tensor:
    """One token through `attn` (a `window.WindowAttention`; not imported: it imports this): x [B, d_model] -> [B, d_model], with
    state["win_k"], ["win_v"] [B, G, S + W, D] (and ["gla"] with the branch) written in place."""
    c = attn.config
    B = x.shape[0]
    H, G, D, S, W = c.n_heads, c.kv_heads, c.head_k_dim, c.sinks, c.window
    R, half = H // G, D // 2
    tabs = step_tables(S, W, D, c.rope_theta, x.device, attn.memory_at)
    memory = "mem_k" in state  # this layer keeps a memory (`state_spec.memory_layers`)
    # One row through the C step; with a memory, every row one by one (the torch form below
    # ranks the candidates with a sort per step, ~4x the window's time).
    if (B == 1 or memory) and kernels_may_run() and _native_ok(attn, x, state):
        lib = native.library()
        if lib is not None:
            return _native_step(lib, attn, x, state, pos, tabs)
    ts = pos.tolist()
    cs = [canonical(t, S, W) for t in ts]
    slots = [t if t < S else S + (t - S) % W for t in ts]
    cos3, sin3 = _rows(tabs.cos3, cs), _rows(tabs.sin3, cs)  # [B, 3, D]
    q, k, v = project(attn, attn.FUSED, x)
    q, k, v = f32(q).reshape(B, G, R, D), f32(k).reshape(B, G, D), f32(v).reshape(B, G, D)
    win_k, win_v = state["win_k"], state["win_v"]
    cos_k, sin_k = cos3[:, None, 1], sin3[:, None, 1]  # [B, 1, D]: the key's angle is its slot
    br = attn.gla_branch
    if br is not None or memory:  # the key/value leaving the window: the slot's old content, read before the write
        if B == 1:
            old_k, ev_v = win_k[:, :, slots[0]], win_v[:, :, slots[0]].clone()
        else:
            at = torch.tensor(slots, device=x.device).view(B, 1, 1, 1).expand(B, G, 1, D)
            old_k, ev_v = win_k.gather(2, at)[:, :, 0], win_v.gather(2, at)[:, :, 0]
        ev_k = old_k * cos_k - old_k.roll(half, -1) * sin_k  # rotated back from the slot's angle
        ok = [ci >= S + W for ci in cs]  # a key leaves the window only once t - W >= S
    kr = torch.addcmul(k * cos_k, k.roll(half, -1), sin_k)
    if B == 1:
        win_k[:, :, slots[0]] = kr
        win_v[:, :, slots[0]] = v
    else:
        at = torch.tensor(slots, device=x.device).view(B, 1, 1, 1).expand(B, G, 1, D)
        win_k.scatter_(2, at, kr[:, :, None])
        win_v.scatter_(2, at, v[:, :, None])
    # The query at its three angles, scored against every slot in one matmul.
    qs = q * D**-0.5
    qr = torch.addcmul(qs[:, :, None] * cos3[:, None, :, None], qs.roll(half, -1)[:, :, None], sin3[:, None, :, None])
    scores = (qr.view(B, G, 3 * R, D) @ win_k.transpose(-1, -2)).view(B, G, 3, R, S + W)
    row = _rows(tabs.row, cs).view(B, 1, 1, 1, S + W).expand(B, G, 1, R, S + W)
    scores = scores.gather(2, row)[:, :, 0] + _rows(tabs.bias, cs).view(B, 1, 1, S + W)  # [B, G, R, S + W]
    if br is None and not memory:
        y = torch.softmax(scores, -1) @ win_v  # [B, G, R, D]
        return attn.o_proj(y.view(B, H * D).to(x.dtype))
    m = scores.amax(-1, keepdim=True)
    p = (scores - m).exp_()
    num = p @ win_v  # [B, G, R, D]
    den = p.sum(-1)  # [B, G, R]
    if br is not None:
        # The branch: phi of the un-rotated q, and of the key leaving the window for each of its
        # R query heads (no repeat: the kv head broadcasts against the R heads' maps).
        F_ = c.feature_size
        phi_q = _phi(q, br.q_map, c.feature_map)  # [B, G, R, 1, F]
        phi_k = _phi(ev_k[:, :, None].expand(B, G, R, D), br.k_map, c.feature_map)
        if not all(ok):
            phi_k = phi_k * torch.tensor(ok, dtype=phi_k.dtype, device=x.device).view(B, 1, 1, 1, 1)
        g = torch.nn.functional.logsigmoid(torch.nn.functional.linear(f32(x), f32(br.decay_weight), f32(br.decay_bias)))
        g = attn.decay_tap((g / c.gate_normalizer).view(B, 1, H))  # hooks see [B, T, H], as from forward
        # S <- exp(g) S + phi_k [v, 1]^T, written in place; o = scale phi_q S.
        gla = state["gla"].view(B, G, R, F_, D + 1)
        gla.mul_(g.exp().view(B, G, R, 1, 1))
        gla[..., :D].addcmul_(phi_k.view(B, G, R, F_, 1), ev_v.view(B, G, 1, 1, D))
        gla[..., D].add_(phi_k.view(B, G, R, F_))
    if memory:
        qm = torch.addcmul(qs * tabs.cos_mem, qs.roll(half, -1), tabs.sin_mem)  # [B, G, R, D] at the memory's angle
        if c.memory_policy == "attention":
            score = ((qm * ev_k[:, :, None]).sum(-1) - m[..., 0]).exp().div(den).mean(-1)  # [B, G]
        elif c.memory_policy == "novelty":  # the ring's window slots, after the write: the W keys left
            ring = win_k[:, :, S:]
            keys = ring * tabs.cos_ring - ring.roll(half, -1) * tabs.sin_ring  # rotated back
            score = novelty(ev_k[:, :, None], keys, _rows(tabs.twin, cs)[:, None])[..., 0]  # past the span only
        else:
            score = recall_error(ev_v[:, :, None].expand(B, G, R, D), (phi_k @ gla)[..., 0, :])
        mem = {n: state[n] for n in MEMORY_NAMES}
        leaving = torch.tensor(ok, device=x.device)[:, None]
        *_, new = admit(mem, ev_k[:, :, None], ev_v[:, :, None], score[..., None], pos[:, None] - W + 1, leaving)
        for n in MEMORY_NAMES:
            state[n].copy_(new[n])  # keys and values rounded to bf16 here, before anything reads them
        s_mem = (qm @ state["mem_k"].float().transpose(-1, -2)).masked_fill((state["mem_pos"] == EMPTY)[:, :, None], float("-inf"))
        m_all = torch.maximum(m, s_mem.amax(-1, keepdim=True))
        p_mem, rescale = (s_mem - m_all).exp(), (m - m_all).exp()
        num = num * rescale + p_mem @ state["mem_v"].float()
        den = den * rescale[..., 0] + p_mem.sum(-1)
    if br is None:
        return attn.o_proj((num / den.unsqueeze(-1)).reshape(B, H * D).to(x.dtype))
    o = phi_q @ gla  # [B, G, R, 1, D + 1]
    scale = F_**-0.5 if c.qk_scale else 1.0  # the GLA kernel's scale, as `run_gla` applies it
    gnum, gden = o[..., 0, :D], o[..., 0, D]
    mix = f32(br.mix)
    if c.combine == "softmax":
        beta = (mix.exp() * scale).view(G, R, 1)
        y = torch.addcmul(num, beta, gnum) / torch.addcmul(den, beta[..., 0], gden).unsqueeze(-1)
    else:
        y = torch.addcmul(num / den.unsqueeze(-1), mix.view(G, R, 1), gnum * scale / (gden * scale + GATED_EPS).unsqueeze(-1))
    return attn.o_proj(y.reshape(B, H * D).to(x.dtype))


def _phi(x: Tensor, weight: Tensor | None, kind: str) -> Tensor:
    """`window.feature_map` in the step's layout: x [B, G, R, D] -> [B, G, R, 1, F]
    (hedgehog: softmax(x W_h) ++ softmax(-x W_h); elu: elu(x) + 1)."""
    x = x.unsqueeze(-2)
    if kind == "elu":
        return torch.nn.functional.elu(x) + 1.0
    assert weight is not None
    G, R = x.shape[1], x.shape[2]
    z = x @ f32(weight).view(G, R, weight.shape[1], weight.shape[2])
    return torch.stack([z, z.neg()], -2).softmax(-1).flatten(-2)


def kernels_may_run() -> bool:
    """What any use of `native`'s C kernels needs first: no graph being captured (serve's
    torch.compile traces the torch ops), no gradient, no global module hook to call."""
    hooks = torch.nn.modules.module
    return not (torch.compiler.is_compiling() or torch.is_grad_enabled()
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


def native_memory_ok(config: Any) -> bool:
    """Whether `native`'s window kernel runs this config's memory: none, or the "novelty"
    policy (`laplace_window_memory`; the other policies are torch's alone)."""
    return not config.memory_slots or config.memory_policy == "novelty"


KERNEL_DTYPES = {n: dtype for group in MEMORY_GROUPS for n, dtype in zip(group, (torch.bfloat16, torch.bfloat16, torch.float32, torch.int64))}


def native_state_ok(state: dict[str, Tensor]) -> bool:
    """Whether state tensors (a layer's, or every layer's) are in the form the C kernels
    write: contiguous, fp32 (the memory's positions int64, its keys and values bf16)."""
    return all(t.dtype == KERNEL_DTYPES.get(n, torch.float32) and t.is_contiguous() for n, t in state.items())


def _native_ok(attn: Any, x: Tensor, state: dict[str, Tensor]) -> bool:
    """Whether `native`'s C step can take this token (`kernels_may_run` checked): CPU rows, a
    memory it runs (`native_memory_ok`), no probe hooked on the decays, the state in the
    kernels' form (`native_state_ok`)."""
    c = attn.config
    if x.device.type != "cpu" or not native_memory_ok(c) or c.head_k_dim != c.head_v_dim:
        return False
    tap = attn.decay_tap
    if tap._forward_hooks or tap._forward_pre_hooks:
        return False
    return native_state_ok(state)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _native_step(lib: Any, attn: Any, x: Tensor, state: dict[str, Tensor], pos: Tensor, tabs: StepTables) -> Tensor:
    """`window_step_` through `native/decode.c`: the same math in one call per row (each row
    at its own position, on its own slice of the state)."""
    c = attn.config
    B = x.shape[0]
    qkv = torch.cat([f32(a) for a in project(attn, attn.FUSED, x)], -1).contiguous()
    xin = f32(x).contiguous()
    y = torch.empty(B, c.n_heads * c.head_v_dim)
    ts = pos.reshape(B).tolist()
    for b in range(B):
        row = state if B == 1 else {n: t[b : b + 1] for n, t in state.items()}
        run_window(lib, attn, row, ts[b], tabs, qkv[b : b + 1], 0, None, xin[b : b + 1], y[b : b + 1])
    return attn.o_proj(y.to(x.dtype))


def run_window(lib: Any, attn: Any, state: dict[str, Tensor], t0: int, tabs: StepTables, qkv: Tensor, io_bf16: int,
               qkv_scale: Tensor | None, xin: Tensor, y: Tensor) -> None:
    """`native/decode.c`'s laplace_window over the rows of qkv [T, (H + 2G) D] (fp32, or bf16
    times qkv_scale), the first at position t0: y [T, H D] written, and the layer's state
    (`state`: its ring, and branch and memory) advanced by T tokens in place. xin [T, d_model]
    is the mixer's fp32 input, which the branch's decay reads. Rows must be contiguous; a
    memory must be "novelty" (`native_memory_ok`)."""
    c, br = attn.config, attn.gla_branch
    H, G, D, S, W = c.n_heads, c.kv_heads, c.head_k_dim, c.sinks, c.window
    T = qkv.shape[0]
    assert qkv.stride(-1) == 1 and y.stride(-1) == 1 and xin.stride(-1) == 1 and y.shape[0] == xin.shape[0] == T
    args = [qkv.data_ptr(), io_bf16, _ptr(qkv_scale), qkv.stride(0), state["win_k"].data_ptr(), state["win_v"].data_ptr(),
            tabs.cos3.data_ptr(), tabs.sin3.data_ptr(), tabs.row.data_ptr(), tabs.bias.data_ptr(), t0, T, H, G, D, S, W]
    keep: list[Tensor] = []
    if br is None:
        args += [None, xin.data_ptr(), xin.stride(0), c.d_model, None, None, None, None, 0, 1.0, None, 1.0, 0, GATED_EPS]
    else:
        maps = [None, None] if c.feature_map == "elu" else [f32(br.q_map).contiguous(), f32(br.k_map).contiguous()]
        params = [f32(br.decay_weight).contiguous(), f32(br.decay_bias).contiguous(), f32(br.mix).contiguous()]
        keep = [*params, *(m for m in maps if m is not None)]  # alive until the call returns
        args += [state["gla"].data_ptr(), xin.data_ptr(), xin.stride(0), c.d_model, params[0].data_ptr(), params[1].data_ptr(),
                 _ptr(maps[0]), _ptr(maps[1]), 0 if maps[0] is None else maps[0].shape[-1], float(c.gate_normalizer),
                 params[2].data_ptr(), c.feature_size**-0.5 if c.qk_scale else 1.0, int(c.combine != "softmax"), GATED_EPS]
    # A prefill's rows split their heads over 2 threads (decode.c), when torch may use 2. A
    # decode step stays on this thread: torch's own threads run its matmuls here, and the
    # kernel's helper thread, spinning between jobs, would take a core from them.
    args += [y.data_ptr(), y.stride(0), min(2, torch.get_num_threads()) if T > 1 else 1]
    if "mem_k" in state:
        assert native_memory_ok(c), c.memory_policy
        rc = lib.laplace_window_memory(*args, *(state[n].data_ptr() for n in MEMORY_NAMES), state["mem_k"].shape[-2],
                                       tabs.mem_tab.data_ptr(), NOVELTY_SPAN, 1.0 - TWIN)
    else:
        rc = lib.laplace_window(*args)
    if rc != 0:
        raise ValueError(f"the window kernel refused the shapes H={H} G={G} D={D} S={S} W={W}")
    del keep
