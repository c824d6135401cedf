"""The window mixer's bounded memory of evicted tokens (LoLA, arXiv 2505.23666; TOVA, arXiv
2401.06104). Math only.

Per kv head, in every layer or in the layers `memory_layers` names, M slots hold the keys and
values of tokens that have left the window, in bf16 (`state_spec.MEMORY_DTYPE`: a token is
scored as it leaves, then kept, and so read by every path, rounded).
The window's own softmax reads them, beside the sinks and the window, at one RoPE distance:
W, just past the window's edge, unless the config's `memory_distance` names another
(`LaplaceConfig.memory_read_at`; `memory_rest_distance` gives the rest group its own,
`memory_read_at_layer`); one angle a layer, so none grows with the session (as the sinks'
do not).

Which tokens it keeps. A token leaving the window at step t becomes a candidate with a score
>= 0. The memory is, at every step, the M best candidates so far by (score, position): the
rule "a newcomer replaces the worst slot if it ranks above it" keeps exactly that set. So
what the memory holds depends only on the tokens read, never on how they were split into
calls, and a block of c steps is one computation: candidate x is in the memory at step i iff
it has arrived by i and fewer than M candidates that arrived by i rank above it.

Slots are kept in position order with the empty ones first. mem_pos holds 1 + the token's
position, so an all-zero state is an empty memory and equal memories are equal bytes.

The scores (the policy; chosen by measurement, recipes/smollm2_hybrid/measure/memory.py):
- "recall", LoLA's self-recall error: || v - S^T phi(k) / z^T phi(k) ||^2, how badly the GLA
  branch's state gives back the token's value from its key right after writing it (mean over
  the kv head's query heads). What the branch already holds well, the memory need not.
- "attention", TOVA's: the softmax weight that the query of step t gives the leaving key at
  RoPE distance W, normalised over sinks and window (not the memory, so a block's scores are
  known before its memory is), mean over the kv head's query heads.
- "novelty": how unlike the keys still in the window the leaving key is,
  max(0, 1 - TWIN - max_j cos(k, k_j)) over the keys that remain once it has left and lie more
  than NOVELTY_SPAN tokens after it (positions p + NOVELTY_SPAN + 1 .. p + W for the token at
  p), un-rotated, per kv head. Repetitive text (filler, common words) has a near-twin in the
  window and scores 0; a name, number or pass key said once has none, so the memory keeps what
  nothing later repeats.
  NOVELTY_SPAN: a repeat right after a token is content, not redundancy: the doubled digit of
  a pass key "88020", a doubled letter, "very very". Its first copy leaves the window while
  the second, an almost identical un-rotated key, is still in it; counted as a twin, that copy
  would score 0 and never be kept, and the memory would give back "8020". So keys within the
  span after the leaving one are not twins; a repeat further away (the same filler sentence,
  a word used again) is, and makes the token redundant as before. The span is in tokens,
  after the leaving token, so it is fixed by the positions alone (every form agrees on it);
  with W <= NOVELTY_SPAN no key counts and every token scores 2 - TWIN. Keys, not key ++ value: the memory is
  read by key, so a leaving key with a near-twin in the window is one whose queries the window
  already answers (with the twin's value); values would double the cost of the score. Not yet
  measured against k ++ v on a model. The window is fixed at the step the token leaves, so
  the score is too. The ring holds its keys rotated to their slots' angles: they are rotated
  back first (cos(R_a x, R_b y) != cos(x, y) for a != b, so no shortcut on rotated keys).
  TWIN: an exact twin read back through the ring's rotation has a cosine of 1 up to rounding
  (1e-7); within TWIN it scores exactly 0, so a prefill and a token-by-token decode rank it
  the same (a tie at 0 goes to the later token, as every tie does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from agent.runtime.state_spec import MEMORY_NAMES  # noqa: F401  (declared torch-free; importable from here too)


TWIN = 1e-4  # "novelty": a key within this cosine of a window key is a repeat (score 0); see above
NOVELTY_SPAN = 8  # "novelty": window keys at most this many tokens after the leaving one are no twins; see above
EMPTY = 0  # mem_pos of a slot that holds no token (its key, value and score are 0 too)


def admit(mem: dict[str, Tensor], k: Tensor, v: Tensor, score: Tensor, pos: Tensor, ok: Tensor
          ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
    """c steps of the memory at once.

    mem: mem_k, mem_v [B, G, M, D], mem_score, mem_pos [B, G, M] before the first step; the
    tokens leaving the window at the c steps: k, v [B, G, c, D], score [B, G, c], pos [B, c]
    int64 (1 + position, as mem_pos), ok [B, c] (whether a token leaves at that step).

    Returns the candidates (the M slots, then the c tokens) as fp32 keys, values [B, G, M + c, D]
    and alive [B, G, M + c, c]: whether candidate x is in the memory at step i (what step i's
    query reads); and the memory after the last step."""
    mk, mv, ms, mp = mem["mem_k"], mem["mem_v"], mem["mem_score"], mem["mem_pos"]
    B, G, M = ms.shape
    c = score.shape[-1]
    dev = ms.device
    ck, cv = torch.cat([mk, k], 2), torch.cat([mv, v], 2)
    cs = torch.cat([ms, score], 2)
    cp = torch.cat([mp, pos[:, None].expand(B, G, c)], 2)
    real = torch.cat([mp != EMPTY, ok[:, None].expand(B, G, c)], 2)  # [B, G, C]
    arrive = torch.cat([torch.full((M,), -1, device=dev), torch.arange(c, device=dev)])  # the step each is there from
    # above[y, x]: y ranks above x (higher score; on a tie, the later token).
    above = (cs[..., :, None] > cs[..., None, :]) | ((cs[..., :, None] == cs[..., None, :]) & (cp[..., :, None] > cp[..., None, :]))
    there = real[..., None] & (arrive[:, None] <= torch.arange(c, device=dev)[None, :])  # [B, G, C, c]
    rank = above.transpose(-1, -2).float() @ there.float()  # rank[x, i]: candidates there at i that rank above x
    alive = there & (rank < M)
    # The memory after the block: those alive at its last step in position order, then enough
    # of the old empty slots (there always are: see the module docstring) before them.
    empty_slot = torch.arange(M + c, device=dev) < M
    order = torch.where(alive[..., -1], cp, torch.where(empty_slot & ~real, EMPTY, EMPTY - 1))  # EMPTY - 1: dropped
    keep = order.sort(dim=-1, stable=True).indices[..., c:]  # [B, G, M]
    take = keep[..., None].expand(B, G, M, ck.shape[-1])
    new = {"mem_k": ck.gather(2, take).to(mk.dtype), "mem_v": cv.gather(2, take).to(mv.dtype), "mem_score": cs.gather(2, keep),
           "mem_pos": cp.gather(2, keep)}
    return ck, cv, alive, new


def recall_error(v: Tensor, o: Tensor) -> Tensor:
    """LoLA's score: v [..., R, D] the token's value as each query head sees it, o [..., R, D + 1]
    the branch's read of its key (numerator, then normaliser) -> mean over R of ||v - o / z||^2."""
    D = v.shape[-1]
    z = o[..., D : D + 1]
    back = torch.where(z > 0, o[..., :D] / z.clamp_min(1e-30), 0.0)
    return (v - back).square().sum(-1).mean(-1)


def novelty(k: Tensor, keys: Tensor, ok: Tensor | None) -> Tensor:
    """The "novelty" score: k [B, G, c, D] the keys leaving at c steps, keys [B, G, N, D] keys
    that may be in the window, ok [B, c, N]: whether key j counts for step i: it is in the
    window that remains after step i's token (at p) has left and its position is > p +
    NOVELTY_SPAN (`twin_ok`; None: all count), all un-rotated -> [B, G, c]:
    max(0, 1 - TWIN - max_j cos(k_i, k_j)), max over no key = -1."""
    cos = F.normalize(k, dim=-1) @ F.normalize(keys, dim=-1).transpose(-1, -2)  # [B, G, c, N]
    near = (cos if ok is None else cos.masked_fill(~ok[:, None], -1.0)).amax(-1)
    return (1.0 - TWIN - near).clamp_min(0.0)


def twin_ok(leaving: Tensor, at: Tensor) -> Tensor:
    """Whether a window key at position `at` may be a twin of the token leaving at `leaving`
    (broadcasting int64 positions): only past the span right after it (see NOVELTY_SPAN)."""
    return at > leaving + NOVELTY_SPAN
