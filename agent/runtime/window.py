"""The window mixer: a Llama teacher's attention kept over a fixed window, plus a
Simple-GLA branch over the keys that have left it (LoLCATs-style). Math only.

Per layer, with H query heads sharing G key/value heads (GQA), head dim D:

- Softmax attention of the query at absolute position t over S sink keys (positions < S)
  and the last W keys (positions (t - W, t], those >= S). Up to S + W tokens that is every
  key: the teacher exactly.
- Positions (StreamingLLM's in-cache positions). A window key at distance d from the
  query gets RoPE distance d (true); a sink key i is placed right before the window:
  distance min(t, S + W - 1) - i.
- State: a ring of S + W slots per kv head (`win_k`, `win_v`): key p < S sits in slot p,
  key p >= S in slot S + (p - S) mod W. Each key is stored ROTATED, once, as it enters:
  to the angle of its slot s (not of its position), so no angle ever exceeds S + 2W
  however long the session (fp32 never sees a huge position) and no key is rotated
  again. A window key p of "epoch" e(p) = (p - S) div W sits at angle p - e(p) W, so the
  query at t meets it with RoPE distance t - p when rotated to slot(t) (key of t's epoch)
  or to slot(t) + W (the epoch before: the window spans at most two). Slots that hold no
  key yet are zero, so a state depends only on the tokens read, not on how they were
  split into calls. (States of format version 2 held un-rotated keys; `state.py` rotates
  them on load.)
- The GLA branch (optional): the key/value at position p >= S enters the branch's state
  when it leaves the window, at step t = p + W, so it is the standard Simple GLA over the
  stream shifted by W:  S_t = exp(g_t) S_(t-1) + phi(k_(t-W)) [v_(t-W), 1]^T,
  o_t = phi(q_t) S_t, whose first W inputs of each call come from the ring. phi is a
  feature map of the un-rotated q and k (position-free: the decay carries recency; a key
  leaving the ring is rotated back from its slot's angle); the
  appended ones column makes the last column of o the normaliser z. g_t is a per-head
  data-dependent decay of the current token (logsigmoid(w x + b) / normalizer, biases from
  a half-life schedule), k and v are expanded from the G kv heads to the H query heads.
- Combine: "softmax" (LoLCATs, one normalisation):
      y = (sum_win e^(s - m) v + beta phi(q) S) / (sum_win e^(s - m) + beta phi(q) z)
  with beta = exp(log_beta) per head; "gated":
      y = softmax_win(s) v + gate * phi(q) S / (phi(q) z + eps), gate per head starting at 0.
  With the branch off (or its gate at 0) the layer is the window-only teacher exactly.

`window_attention` is the fast sequence path (banded blocks over static shapes: S, W and
the call's T fix every shape; the ring is read in place, never reordered);
`window_decode.window_step_` the lean decode step (one key rotated and written, the ring read in
place); `hybrid_attention_naive` the slow per-query reference from the definition above,
with true positions and un-rotated keys; `naive_forward` runs a whole model through it.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, StateSpec, init_ffn, project, rope, run_gla
from agent.runtime.memory import MEMORY_NAMES, TWIN, admit, novelty, recall_error, twin_ok
from agent.runtime.state_spec import WINDOW_USES_POSITIONS, memory_slots_of, window_state_spec
from agent.runtime.window_decode import GATED_EPS, ring_slot, window_step_

LOG_BETA_INIT = -4.0  # softmax combine: beta = exp(-4) ~ 0.018 at init, the branch barely on


def rotate_ring_keys(win_k: Tensor, theta: float, sign: int = 1) -> Tensor:
    """Keys [..., S + W, D] rotated to their slots' angles (sign -1: back to un-rotated):
    the conversion between format version 2's un-rotated ring and today's."""
    slots = torch.arange(win_k.shape[-2], device=win_k.device)
    return rope(win_k, sign * slots, theta)


# ---- the fast path ---------------------------------------------------------------------


def evictions(k: Tensor, v: Tensor, win_k: Tensor, win_v: Tensor, pos: Tensor, lengths: Tensor | None,
              *, window: int, sinks: int, theta: float) -> tuple[Tensor, Tensor, Tensor]:
    """What leaves the window at each step of a call, as `window_attention` returns it:
    ev_k (un-rotated), ev_v [B, T, G, D] and ev_ok [B, T]; for the branch before attention."""
    B, T, G, D = k.shape
    S, W = sinks, window
    it = torch.arange(T, device=k.device)
    t0 = pos.to(torch.long)
    e = min(T, W)
    ev_at = S + torch.remainder(t0[:, None] + it[None, :e] - S, W)  # [B, e]
    ev_slot = ev_at[:, None, :, None].expand(B, G, e, D)
    ring_ev = rope(win_k.gather(2, ev_slot), -ev_at[:, None, :], theta)
    ev_k = torch.cat([ring_ev, k.transpose(1, 2)[:, :, : T - e]], 2)  # [B, G, T, D]
    ev_v = torch.cat([win_v.gather(2, ev_slot), v.transpose(1, 2)[:, :, : T - e]], 2)
    n = lengths if lengths is not None else torch.full((B,), T, dtype=torch.long, device=k.device)
    ev_ok = (t0[:, None] + it[None, :] - W >= S) & (it[None, :] < n[:, None])
    return ev_k.transpose(1, 2), ev_v.transpose(1, 2), ev_ok



def window_attention(
    q: Tensor, k: Tensor, v: Tensor, win_k: Tensor, win_v: Tensor, pos: Tensor, lengths: Tensor | None,
    *, window: int, sinks: int, theta: float, block: int,
    memory: dict[str, Tensor] | None = None, memory_policy: str = "attention", ev_score: Tensor | None = None,
    evicted: tuple[Tensor, Tensor, Tensor] | None = None, memory_at: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, dict[str, Tensor] | None]:
    """Softmax attention over sinks + window (+ the memory), and the ring (and memory) update.

    q [B, T, H, D]; k, v [B, T, G, D] un-rotated; win_k (keys rotated to their slots),
    win_v [B, G, S + W, D]; pos [B] int64: tokens each row read before this call; lengths
    [B]: real tokens per row (the rest is padding and writes nothing), or None.

    memory (`memory.py`; None: no memory): mem_k, mem_v, mem_score, mem_pos of the layer;
    memory_policy: how a leaving token is scored: "attention" and "novelty" here, "recall" by
    the caller from the branch, which passes ev_score [B, T, G] (the score of the token
    leaving at each step; used whenever given).
    evicted: `evictions(...)` of this call when the caller has it already (the branch's inputs).
    memory_at: the RoPE distance the memory is read (and "attention" scores) at; None: W.

    Returns (num [B, T, H, D], den [B, T, H]: the softmax numerator and denominator
    relative to each query's max score; new win_k, new win_v; evicted ev_k (un-rotated),
    ev_v [B, T, G, D]: the key/value that leaves the window at each step, and ev_ok [B, T]:
    whether there is one (its position is >= S and the step is real); the new memory or None).

    The ring is read where it lies: ring slot s holds position t0 - W + ((s - t0 + S) mod W)."""
    B, T, H, D = q.shape
    G = k.shape[2]
    R, S, W = H // G, sinks, window
    dev = q.device
    n = lengths if lengths is not None else torch.full((B,), T, dtype=torch.long, device=dev)
    t0 = pos.to(torch.long)
    kn, vn = k.transpose(1, 2), v.transpose(1, 2)  # [B, G, T, D]
    it = torch.arange(T, device=dev)
    new_pos = t0[:, None] + it[None, :]  # [B, T]
    new_slot = ring_slot(new_pos, S, W)
    kr = rope(kn, new_slot[:, None, :], theta)  # each new key rotated once, to its slot's angle
    # The state after the call: token i (real) goes to sink slot p < S, or to ring slot
    # S + (p - S) mod W if it is among the row's last W real tokens; anything else to a spare
    # slot that is cut off. Distinct tokens never share a kept slot.
    real = it[None, :] < n[:, None]
    to_ring = real & (new_pos >= S) & (it[None, :] >= n[:, None] - W)
    slot = torch.where(real & ((new_pos < S) | to_ring), new_slot, S + W)[:, None, :, None].expand(B, G, T, D)
    spare = win_k.new_zeros(B, G, 1, D)
    out_k = torch.cat([win_k, spare], 2).scatter_(2, slot, kr)[:, :, : S + W]
    out_v = torch.cat([win_v, spare], 2).scatter_(2, slot, vn)[:, :, : S + W]
    # Queries: for the sinks at min(t, S + W - 1); for window keys of t's epoch at slot(t),
    # for those of the epoch before at slot(t) + W (see the module docstring).
    js = torch.arange(S, device=dev)
    jw = torch.arange(W, device=dev)
    ring_pos = t0[:, None] - W + torch.remainder(jw[None, :] - t0[:, None] + S, W)  # [B, W], all < t0
    epoch = torch.div(new_pos - S, W, rounding_mode="floor")  # [B, T] (meaningless below S: masked)
    ring_epoch = torch.div(ring_pos - S, W, rounding_mode="floor")
    # Step i evicts position t0 - W + i: an old ring entry for i < W (rotated back from its
    # slot's angle), the call's token i - W after.
    ev_k, ev_v, ev_ok = evicted or evictions(k, v, win_k, win_v, pos, lengths, window=W, sinks=S, theta=theta)
    ev_k, ev_v = ev_k.transpose(1, 2), ev_v.transpose(1, 2)  # [B, G, T, D]
    qh = q.transpose(1, 2).reshape(B, G, R, T, D) * D**-0.5
    q_lo = rope(qh, new_slot[:, None, None, :], theta)
    q_hi = rope(qh, (new_slot + W)[:, None, None, :], theta)
    q_sink = rope(qh, new_pos.clamp(max=S + W - 1)[:, None, None, :], theta)
    if memory is not None:  # memory keys are stored un-rotated and read at one distance (W unless memory_at says)
        q_mem = rope(qh, torch.full((1,), float(W if memory_at is None else memory_at), device=dev), theta)
    if memory is not None and ev_score is None and memory_policy == "novelty":
        ring_un = rope(win_k[:, :, S:], -(S + jw), theta)  # the ring's window keys, un-rotated

    def window_scores(i0: int, i1: int, keys: Tensor, same: Tensor) -> Tensor:
        """Scores of queries i0:i1 against rotated window keys [B, G, N, D]; same [B, c, N]."""
        kt = keys[:, :, None].transpose(-1, -2)
        return torch.where(same[:, None, None], q_lo[..., i0:i1, :] @ kt, q_hi[..., i0:i1, :] @ kt)

    nums, dens = [], []
    for i0 in range(0, T, block):  # static shapes: a compiler unrolls this
        i1 = min(i0 + block, T)
        i = it[i0:i1, None]
        tq = new_pos[:, i0:i1, None]  # [B, c, 1]
        eq = epoch[:, i0:i1, None]
        parts = []  # (scores, values) of each key set
        if S:
            ok = js[None, None, :] <= tq  # [B, c, S]
            parts.append((q_sink[..., i0:i1, :] @ out_k[:, :, None, :S].transpose(-1, -2), ok, out_v[:, :, None, :S]))
        if i0 < W:  # a query i < W still sees part of the ring
            ring_ok = (ring_pos[:, None, :] > tq - W) & (ring_pos[:, None, :] >= S)  # [B, c, W]
            parts.append((window_scores(i0, i1, win_k[:, :, S:], ring_epoch[:, None, :] == eq), ring_ok, win_v[:, :, None, S:]))
        j0 = max(0, i0 - W + 1)  # the call's keys j any query of the block sees: i - W < j <= i
        j = it[None, j0:i1]
        call_ok = (j <= i) & (j > i - W) & (new_pos[:, None, j0:i1] >= S)  # [B, c, i1 - j0]
        same = epoch[:, None, j0:i1] == eq
        parts.append((window_scores(i0, i1, kr[:, :, j0:i1], same), call_ok, vn[:, :, None, j0:i1]))
        scores = [s.masked_fill(~ok[:, None, None], float("-inf")) for s, ok, _ in parts]
        # Every query sees at least one key (itself, or sink 0 while t < S): m is finite.
        m = torch.stack([s.amax(-1) for s in scores]).amax(0)[..., None]
        probs = [(s - m).exp() for s in scores]
        num = sum(p @ val for p, (_, _, val) in zip(probs, parts))
        den = sum(p.sum(-1) for p in probs)
        if memory is not None:  # the block's evictions enter the memory, then its queries read it
            kb, vb = ev_k[:, :, i0:i1], ev_v[:, :, i0:i1]
            if ev_score is not None:
                score = ev_score[:, i0:i1].transpose(1, 2)
            elif memory_policy == "novelty":  # against the window keys the step's query sees, past the span
                leaving = tq - W  # [B, c, 1]: the position leaving at each step
                win_keys, win_ok = kn[:, :, j0:i1], call_ok & twin_ok(leaving, new_pos[:, None, j0:i1])
                if i0 < W:
                    near_ok = ring_ok & twin_ok(leaving, ring_pos[:, None, :])
                    win_keys, win_ok = torch.cat([ring_un, win_keys], 2), torch.cat([near_ok, win_ok], 2)
                score = novelty(kb, win_keys, win_ok)
            else:  # "attention": the weight the step's query gives its leaving key
                s_ev = (q_mem[..., i0:i1, :] * kb[:, :, None]).sum(-1)  # [B, G, R, c]
                score = ((s_ev - m[..., 0]).exp() / den).mean(2)
            # Scored as they leave, kept (and so read, here and by every later step) as the memory stores them.
            kept = memory["mem_k"].dtype
            ck, cv, alive, memory = admit(memory, kb.to(kept).float(), vb.to(kept).float(), score,
                                          new_pos[:, i0:i1] - W + 1, ev_ok[:, i0:i1])
            s_mem = (q_mem[..., i0:i1, :] @ ck[:, :, None].transpose(-1, -2)).masked_fill(
                ~alive.transpose(-1, -2)[:, :, None], float("-inf"))  # [B, G, R, c, M + c]
            m_all = torch.maximum(m, s_mem.amax(-1, keepdim=True))
            p_mem, rescale = (s_mem - m_all).exp(), (m - m_all).exp()
            num = num * rescale + p_mem @ cv[:, :, None]
            den = den * rescale[..., 0] + p_mem.sum(-1)
        nums.append(num)
        dens.append(den)
    num = torch.cat(nums, dim=3).reshape(B, H, T, D).transpose(1, 2)
    den = torch.cat(dens, dim=3).reshape(B, H, T).transpose(1, 2)
    return num, den, out_k, out_v, ev_k.transpose(1, 2), ev_v.transpose(1, 2), ev_ok, memory


def combine(num: Tensor, den: Tensor, gnum: Tensor | None, gden: Tensor | None, mix: Tensor | None, mode: str) -> Tensor:
    """y [B, T, H, D] from the window's (num, den) and the branch's (gnum, gden) with the
    per-head `mix` (log beta for "softmax", the gate for "gated"); no branch: num / den."""
    if gnum is None or gden is None or mix is None:
        return num / den[..., None]
    if mode == "softmax":
        beta = mix.exp()[:, None]
        return (num + beta * gnum) / (den + beta[:, 0] * gden)[..., None]
    return num / den[..., None] + mix[:, None] * gnum / (gden + GATED_EPS)[..., None]


def feature_map(x: Tensor, weight: Tensor | None, kind: str) -> Tensor:
    """phi(x) per head: x [B, T, H, D] -> [B, T, H, F'] (non-negative).
    hedgehog: softmax(x W_h) ++ softmax(-x W_h); elu: elu(x) + 1."""
    if kind == "elu":
        return F.elu(x.float()) + 1.0
    assert weight is not None
    z = torch.einsum("bthd,hdf->bthf", x.float(), weight.float())
    return torch.cat([z.softmax(-1), (-z).softmax(-1)], dim=-1)


# ---- the slow reference -----------------------------------------------------------------


def hybrid_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, *, window: int, sinks: int, theta: float,
    phi_q: Tensor | None = None, phi_k: Tensor | None = None, g: Tensor | None = None,
    mix: Tensor | None = None, mode: str = "softmax", memory_slots: int = 0, memory_policy: str = "attention",
    memory_dtype: torch.dtype = torch.bfloat16, memory_at: int | None = None,
) -> Tensor:
    """The layer's attention from its definition, one query at a time over the whole
    history from position 0, in float64 (no ring, no blocks, no offsets, no slots).

    q [B, T, H, D]; k, v [B, T, G, D] un-rotated; for the branch: phi_q, phi_k [B, T, H, F]
    (phi_k of each position's key as query head h sees it), g [B, T, H], mix [H]. The
    memory: per (row, kv head), the `memory_slots` best-scored tokens that have left the
    window (`memory.py`), read at RoPE distance `memory_at` (None: W), their keys and values
    as stored (`memory_dtype`; scored before rounding). Returns y [B, T, H, D] in v's dtype."""
    B, T, H, D = q.shape
    G = k.shape[2]
    R, S, W, M = H // G, sinks, window, memory_slots
    qd, kd, vd = q.double(), k.double().repeat_interleave(R, 2), v.double().repeat_interleave(R, 2)  # [B, T, H, D]
    km, vm = (x.to(memory_dtype).double().repeat_interleave(R, 2) for x in (k, v))  # as the memory holds them
    branch = phi_q is not None and phi_k is not None and g is not None and mix is not None
    if branch or (M and memory_policy == "recall"):
        assert phi_k is not None and g is not None
        scale = phi_k.shape[-1] ** -0.5  # the GLA kernel's own scale
        gc = torch.cat([g.double().new_zeros(B, 1, H), g.double().cumsum(1)], 1)  # gc[t + 1] = g_0 + ... + g_t
    scores: dict[tuple[int, int, int], float] = {}  # (row, kv head, position) -> the memory's score of that token
    outs = []
    for t in range(T):
        sink = list(range(min(S, t + 1)))
        win = list(range(max(S, t - W + 1), t + 1))
        ev = list(range(S, t - W + 1))  # every token that has left the window
        pos_k = torch.tensor(sink + win, dtype=torch.float64)
        keys = rope(kd[:, sink + win].transpose(1, 2), pos_k, theta)  # [B, H, N, D]
        q_at = torch.tensor([min(t, S + W - 1)] * len(sink) + [t] * len(win), dtype=torch.float64)
        qs = rope(qd[:, t, :, None, :].expand(B, H, len(pos_k), D), q_at, theta)  # the query as each key sees it
        s = (qs * keys).sum(-1) / math.sqrt(D)  # [B, H, N]
        vals = vd[:, sink + win].transpose(1, 2)  # [B, H, N, D]
        if branch or (M and memory_policy == "recall"):
            decay = (gc[:, t + 1, None] - gc[:, [p + W + 1 for p in ev]]).exp() if ev else None  # [B, E, H]: steps p + W + 1 .. t
        if M and ev:
            p = ev[-1]  # the token that left at this step
            q_w = rope(qd[:, t], torch.tensor(float(W if memory_at is None else memory_at), dtype=torch.float64), theta)  # [B, H, D]
            if memory_policy == "attention":
                s_ev = (q_w * kd[:, p]).sum(-1) / math.sqrt(D)  # [B, H]
                w_ev = (s_ev - s.amax(-1)).exp() / (s - s.amax(-1, keepdim=True)).exp().sum(-1)
            elif memory_policy == "novelty":  # against the keys left in the window past the span: p + span + 1 .. t
                far = [j for j in win if twin_ok(p, j)]
                near = (F.cosine_similarity(kd[:, p, :, None], kd[:, far].transpose(1, 2), dim=-1).amax(-1) if far
                        else kd.new_full((B, H), -1.0))  # [B, H]
                w_ev = (1.0 - TWIN - near).clamp_min(0.0)
            else:  # the branch's read of p's own key, right after writing it
                a = torch.einsum("bhf,behf->beh", phi_k[:, p].double(), phi_k[:, ev].double()) * scale * decay
                back = torch.einsum("beh,behd->bhd", a, vd[:, ev]) / a.sum(1)[..., None]
                w_ev = (vd[:, p] - back).square().sum(-1)
            w_ev = w_ev.view(B, G, R).mean(-1)
            for b in range(B):
                for kv in range(G):
                    scores[b, kv, p] = float(w_ev[b, kv])
            held = torch.zeros(B, H, len(ev), dtype=torch.bool)
            for b in range(B):
                for kv in range(G):
                    best = sorted(ev, key=lambda e: (scores[b, kv, e], e), reverse=True)[:M]
                    for e in best:
                        held[b, kv * R : (kv + 1) * R, ev.index(e)] = True
            s_mem = (q_w[:, :, None] * km[:, ev].transpose(1, 2)).sum(-1) / math.sqrt(D)
            s = torch.cat([s, s_mem.masked_fill(~held, float("-inf"))], -1)
            vals = torch.cat([vals, vm[:, ev].transpose(1, 2)], 2)
        w = (s - s.amax(-1, keepdim=True)).exp()
        num = torch.einsum("bhn,bhnd->bhd", w, vals)
        den = w.sum(-1)
        gnum = gden = None
        if branch:
            gnum, gden = num.new_zeros(B, H, D), den.new_zeros(B, H)
            if ev:
                a = torch.einsum("bhf,behf->beh", phi_q[:, t].double() * scale, phi_k[:, ev].double()) * decay
                gnum = torch.einsum("beh,behd->bhd", a, vd[:, ev])
                gden = a.sum(1)
        outs.append(combine(num[:, None], den[:, None], None if gnum is None else gnum[:, None],
                            None if gden is None else gden[:, None], mix.double() if branch else None, mode))
    return torch.cat(outs, 1).to(v.dtype)


# ---- the module ------------------------------------------------------------------------


class GLABranch(nn.Module):
    """The branch's parameters, all under `attn.gla_branch.*`, so a trainer can train them
    alone and a small file of them can be loaded over the teacher's weights:
    q_map, k_map [H, D, F] (hedgehog), decay_weight [H, d_model], decay_bias [H], and
    log_beta [H] ("softmax" combine) or gate [H] ("gated")."""

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        H, D = c.n_heads, c.head_k_dim
        if c.feature_map == "hedgehog":
            self.q_map = nn.Parameter(torch.empty(H, D, c.feature_dim or D))
            self.k_map = nn.Parameter(torch.empty(H, D, c.feature_dim or D))
        else:
            self.q_map = self.k_map = None
        self.decay_weight = nn.Parameter(torch.empty(H, c.d_model))
        self.decay_bias = nn.Parameter(torch.empty(H))
        if c.combine == "softmax":
            self.log_beta = nn.Parameter(torch.empty(H))
        else:
            self.gate = nn.Parameter(torch.empty(H))

    @property
    def mix(self) -> Tensor:
        return self.log_beta if self.config.combine == "softmax" else self.gate

    def log_decay(self, x: Tensor) -> Tensor:
        """g = logsigmoid(w x + b) / normalizer per head: [B, T, d_model] -> [B, T, H] fp32."""
        pre = x.float() @ self.decay_weight.float().t() + self.decay_bias.float()
        return F.logsigmoid(pre) / self.config.gate_normalizer

    @torch.no_grad()
    def init_weights(self) -> None:
        """Identity feature maps, zero decay weights with the half-life schedule's biases,
        and the branch (almost) off: gate 0, or beta = exp(LOG_BETA_INIT)."""
        c = self.config
        for m in (self.q_map, self.k_map):
            if m is not None:
                m.copy_(torch.eye(m.shape[1], m.shape[2]).expand_as(m))
        self.decay_weight.zero_()
        self.decay_bias.copy_(torch.tensor(c.gate_biases()))
        if c.combine == "softmax":
            self.log_beta.fill_(LOG_BETA_INIT)
        else:
            self.gate.zero_()


class WindowAttention(nn.Module):
    """The teacher's q, k, v, o around `window_attention`, plus the optional GLA branch; the
    interface of `mixers.py`. State: win_k, win_v [B, G, S + W, D], gla [B, H, F, D + 1]
    with the branch; it reads positions."""

    uses_positions: ClassVar[bool] = WINDOW_USES_POSITIONS
    FUSED = ("q_proj", "k_proj", "v_proj")  # one matmul when fused for inference (`layers.fuse_linears_`)

    @staticmethod
    def state_spec(config: LaplaceConfig, batch: int) -> StateSpec:
        return window_state_spec(config, batch)

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        kv = c.kv_heads * c.head_k_dim
        self.q_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, kv, bias=False)
        self.v_proj = nn.Linear(c.d_model, kv, bias=False)
        self.o_proj = nn.Linear(c.value_dim, c.d_model, bias=False)
        self.gla_branch = GLABranch(c) if c.gla_branch else None
        self.memory_at = c.memory_read_at  # RoPE distance of this layer's memory read (`Block` sets its group's)
        self.decay_tap = nn.Identity()  # the branch's g passes through it, so probes can hook the decays

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        B, T, _ = x.shape
        q, k, v = project(self, self.FUSED, x)
        q = q.reshape(B, T, c.n_heads, c.head_k_dim).float()
        k = k.reshape(B, T, c.kv_heads, c.head_k_dim).float()
        v = v.reshape(B, T, c.kv_heads, c.head_v_dim).float()
        return q, k, v

    def resting_log_decay(self) -> Tensor:
        """The branch's g per head with the input term left out: [H] (empty without it)."""
        if self.gla_branch is None:
            return self.q_proj.weight.new_zeros(0)
        return F.logsigmoid(self.gla_branch.decay_bias.detach().float()) / self.config.gate_normalizer

    def forward(self, x: Tensor, layer: dict[str, Tensor], lengths: Tensor | None, pos: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        assert pos is not None, "the window mixer reads positions: its model's state carries them"
        c = self.config
        B, T, _ = x.shape
        q, k, v = self._qkv(x)
        memory = {n: layer[n] for n in MEMORY_NAMES} if "mem_k" in layer else None  # `state_spec.memory_layers`
        branch = ev_score = evicted = None
        if self.gla_branch is not None:  # the branch reads what leaves the window: found once, here
            evicted = evictions(k, v, layer["win_k"], layer["win_v"], pos, lengths, window=c.window, sinks=c.sinks, theta=c.rope_theta)
            branch = self.branch_inputs(x, q, *evicted, lengths)
            if memory is not None and c.memory_policy == "recall":
                ev_score = self.recall_scores(branch, layer["gla"])
        num, den, win_k, win_v, *_, memory = window_attention(
            q, k, v, layer["win_k"], layer["win_v"], pos, lengths, window=c.window, sinks=c.sinks,
            theta=c.rope_theta, block=c.chunk_size, memory=memory, memory_policy=c.memory_policy, ev_score=ev_score,
            evicted=evicted, memory_at=self.memory_at)
        out = {"win_k": win_k, "win_v": win_v} | (memory or {})
        if branch is None:
            y = combine(num, den, None, None, None, c.combine)
        else:
            y, out["gla"] = self.combine_branch(branch, num, den, layer["gla"])
        return self.o_proj(y.reshape(B, T, c.value_dim).to(x.dtype)), out

    def step_(self, x: Tensor, state: dict[str, Tensor], pos: Tensor | None) -> Tensor:
        """One decode token, the ring (and branch, memory) written in place: `window_decode.window_step_`."""
        assert pos is not None, "the window mixer reads positions: its model's state carries them"
        return window_step_(self, x, state, pos)

    def branch_inputs(self, x: Tensor, q: Tensor, ev_k: Tensor, ev_v: Tensor, ev_ok: Tensor,
                      lengths: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The GLA branch's (phi_q, phi_k [B, T, H, F], v_aug [B, T, H, D + 1], g [B, T, H]) over
        the keys leaving the window (`window_attention`'s ev_k, ev_v, ev_ok)."""
        c, br = self.config, self.gla_branch
        assert br is not None
        B, T = q.shape[:2]
        R = c.n_heads // c.kv_heads
        phi_q = feature_map(q, br.q_map, c.feature_map)
        phi_k = feature_map(ev_k.repeat_interleave(R, 2), br.k_map, c.feature_map)
        phi_k = torch.where(ev_ok[:, :, None, None], phi_k, 0.0)  # nothing leaves the window: nothing is written
        v_aug = torch.cat([ev_v.repeat_interleave(R, 2), ev_v.new_ones(B, T, c.n_heads, 1)], dim=-1)
        real = torch.ones(B, T, dtype=torch.bool, device=q.device) if lengths is None else (
            torch.arange(T, device=q.device)[None, :] < lengths[:, None])
        g = torch.where(real[:, :, None], self.decay_tap(br.log_decay(x)), 0.0)  # padding decays nothing
        return phi_q, phi_k, v_aug, g

    def recall_scores(self, branch: tuple[Tensor, Tensor, Tensor, Tensor], gla_state: Tensor) -> Tensor:
        """The "recall" policy's score of each leaving token [B, T, G]: the branch reads its
        own key right after writing it (`memory.recall_error`)."""
        c = self.config
        _, phi_k, v_aug, g = branch
        B, T, H, _ = v_aug.shape
        o, _ = run_gla(c, phi_k, phi_k, v_aug, g, gla_state)
        G, R = c.kv_heads, H // c.kv_heads
        return recall_error(v_aug[..., : c.head_v_dim].reshape(B, T, G, R, -1), o.reshape(B, T, G, R, -1))

    def combine_branch(self, branch: tuple[Tensor, Tensor, Tensor, Tensor], num: Tensor, den: Tensor,
                       gla_state: Tensor) -> tuple[Tensor, Tensor]:
        """(y [B, T, H, D], new gla state [B, H, F, D + 1]): the branch's read combined with the
        window's (num, den)."""
        c, br = self.config, self.gla_branch
        assert br is not None
        phi_q, phi_k, v_aug, g = branch
        o, gla_state = run_gla(c, phi_q, phi_k, v_aug, g, gla_state)
        return combine(num, den, o[..., : c.head_v_dim], o[..., c.head_v_dim], br.mix.float(), c.combine), gla_state

    def branch(self, x: Tensor, q: Tensor, num: Tensor, den: Tensor, ev_k: Tensor, ev_v: Tensor, ev_ok: Tensor,
               lengths: Tensor | None, gla_state: Tensor) -> tuple[Tensor, Tensor]:
        """The GLA branch over the evicted keys, combined with the window's (num, den):
        (y [B, T, H, D], new gla state [B, H, F, D + 1]). A trainer of the branch alone can
        call it with the window's part computed once."""
        return self.combine_branch(self.branch_inputs(x, q, ev_k, ev_v, ev_ok, lengths), num, den, gla_state)

    def reference(self, x: Tensor, memory_slots: int | None = None) -> Tensor:
        """The layer over a whole sequence from position 0 through `hybrid_attention_naive`
        (`memory_slots`: this layer's, `state_spec.memory_slots_of`; None: the config's)."""
        c = self.config
        q, k, v = self._qkv(x)
        br = self.gla_branch
        kw = dict(window=c.window, sinks=c.sinks, theta=c.rope_theta)
        if br is not None:
            R = c.n_heads // c.kv_heads
            kw.update(phi_q=feature_map(q, br.q_map, c.feature_map), phi_k=feature_map(k.repeat_interleave(R, 2), br.k_map, c.feature_map),
                      g=br.log_decay(x), mix=br.mix.float(), mode=c.combine)
        slots = c.memory_slots if memory_slots is None else memory_slots
        if slots:
            kw.update(memory_slots=slots, memory_policy=c.memory_policy, memory_at=self.memory_at)
            if br is not None:
                kw.setdefault("phi_k", feature_map(k.repeat_interleave(c.n_heads // c.kv_heads, 2), br.k_map, c.feature_map))
                kw.setdefault("g", br.log_decay(x))
        y = hybrid_attention_naive(q, k, v, **kw)
        return self.o_proj(y.reshape(*x.shape[:2], c.value_dim).to(x.dtype))

    @torch.no_grad()
    def init_weights(self, gen: torch.Generator, std: float, out_std: float, ffn: GLU | None) -> None:
        init_ffn(ffn, gen, std, out_std)
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
        self.o_proj.weight.copy_(torch.randn(self.o_proj.weight.shape, generator=gen) * out_std)
        if self.gla_branch is not None:
            self.gla_branch.init_weights()


@torch.no_grad()
def naive_forward(model: nn.Module, ids: Tensor) -> Tensor:
    """Logits [B, T, vocab] of a window-mixer model through the slow reference, from
    position 0 with no state: the fast path's tests compare against this."""
    x = model.embed(ids)
    for i, block in enumerate(model.blocks):
        x = x + block.attn.reference(block.attn_norm(x), memory_slots_of(model.config, i))
        if block.ffn is not None:
            x = x + block.ffn(block.ffn_norm(x))
    h = model.norm(x)
    return model.lm_head(h) if model.lm_head is not None else h @ model.embed.weight.t()
