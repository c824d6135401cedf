"""Asking a state: forced choice, greedy answer and blank-state control in one batch.

`ask` never modifies the state it is given (the model's forward returns new tensors), so
a sweep asks at a distance and keeps reading filler from the same state: one pass over the
filler serves every distance. The blank control is the same question on a state that has
read nothing, batched beside the real one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from agent.runtime.model import LaplaceModel
from agent.runtime.state import RecurrentState

SEGMENT = 512  # filler is folded in segments of this many tokens: memory stays flat


@dataclass(frozen=True)
class Answer:
    """What a state (and the blank control) say to one question."""

    rank: int  # 1-based rank of the true answer among the candidates (forced choice)
    n_candidates: int
    pick: int  # index of the top-1 candidate
    logp: float  # log-prob of the true answer's tokens after the cue
    blank_logp: float  # the same from a state that read nothing
    blank_rank: int
    greedy: str  # decoded greedy continuation of the cue
    exact: bool  # the greedy continuation starts with the answer
    contains: bool  # the answer appears anywhere in it

    @property
    def top1(self) -> bool:
        return self.rank == 1

    @property
    def lift(self) -> float:
        return self.logp - self.blank_logp


ROW_BYTES = 1 << 30  # candidate rows are scored in chunks of at most ~1 GB of state


def _pad(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids, torch.tensor([len(r) for r in rows], device=device)


def _take(state: RecurrentState, index: Tensor) -> RecurrentState:
    return state.index_select(index)


@torch.inference_mode()
def advance(model: LaplaceModel, state: RecurrentState, ids: Sequence[int], segment: int = SEGMENT) -> tuple[Tensor | None, RecurrentState]:
    """Fold `ids` into a batch-1 state in fixed segments; returns (last logits [V] or None, state)."""
    logits, state = advance_rows(model, state, [ids], segment)
    return (None if logits is None else logits[0]), state


@torch.inference_mode()
def advance_rows(model: LaplaceModel, state: RecurrentState, rows: Sequence[Sequence[int]], segment: int = SEGMENT) -> tuple[Tensor | None, RecurrentState]:
    """Fold one token list per batch row, in fixed segments. Rows may differ in length:
    shorter rows are padded, and padded positions leave their state exactly as it was.
    Returns (each row's logits after its last token [B, V] or None, state)."""
    device = model.embed.weight.device
    n0, top = state.n_tokens, max((len(r) for r in rows), default=0)
    ragged = len({len(r) for r in rows}) > 1
    ids, lens = _pad(rows, device) if top else (None, None)
    logits = None
    for start in range(0, top, segment):
        seg = ids[:, start : start + segment]
        valid = (lens - start).clamp(0, seg.shape[1]) if ragged else None
        out, state = model(seg, state, lengths=valid, last_only=True)
        if logits is None:
            logits = out[:, -1]
        else:  # keep each row's logits after its own last real token
            has = (valid if valid is not None else torch.full_like(lens, seg.shape[1])) > 0
            logits = torch.where(has[:, None], out[:, -1], logits)
    state.n_tokens = n0 + top
    return logits, state


def ask(
    model: LaplaceModel,
    state: RecurrentState,
    question: Sequence[int],
    candidate_ids: Sequence[Sequence[int]],
    answer_index: int,
    *,
    decode: Callable[[list[int]], str],
    answer: str,
    greedy_tokens: int,
    stop_ids: Sequence[int] = (),
) -> Answer:
    """`ask_rows` for one batch-1 state."""
    return ask_rows(model, state, [question], [candidate_ids], [answer_index], decode=decode, answers=[answer],
                    greedy_tokens=[greedy_tokens], stop_ids=stop_ids)[0]


@torch.inference_mode()
def ask_rows(
    model: LaplaceModel,
    state: RecurrentState,
    questions: Sequence[Sequence[int]],
    candidate_ids: Sequence[Sequence[Sequence[int]]],
    answer_index: Sequence[int],
    *,
    decode: Callable[[list[int]], str],
    answers: Sequence[str],
    greedy_tokens: Sequence[int],
    stop_ids: Sequence[int] = (),
    blank: bool = True,
) -> list[Answer]:
    """Ask each batch row of `state` its own question; score its candidates' tokens after
    the question on the row and (with `blank`) on a blank state, and decode a greedy answer.

    The blank control depends only on the question and candidates, so a sweep asking the
    same ones at many distances computes it once (`blank=False` leaves its fields NaN / 0).
    A row's candidates must share one token length (their summed log-probs are compared);
    lengths may differ between rows."""
    B = len(questions)
    for c in candidate_ids:
        if len({len(x) for x in c}) != 1 or 0 in {len(x) for x in c}:
            raise ValueError("a row's candidates must be non-empty and share one token length")
    device = model.embed.weight.device
    K = 2 if blank else 1
    both = RecurrentState.stack([state, RecurrentState.zeros(model.config, B, device)]) if blank else state
    first_logits, q_state = advance_rows(model, both, list(questions) * K)  # B real rows, then B blank
    first = torch.log_softmax(first_logits.float(), -1)  # [2B, V]
    # One flat row per (question row, candidate), real then blank, scored in chunks.
    owner = [b for b in range(B) for _ in candidate_ids[b]]
    flat = [x for b in range(B) for x in candidate_ids[b]]
    R = len(flat)
    src = torch.tensor(owner + ([B + b for b in owner] if blank else []), device=device)
    cand, clen = _pad(flat * K, device)
    scores = torch.full((2 * R,), math.nan, device=device)
    chunk = max(1, ROW_BYTES // max(1, q_state.nbytes // (K * B)))
    for lo in range(0, K * R, chunk):
        hi = min(K * R, lo + chunk)
        rows, c, n = _take(q_state, src[lo:hi]), cand[lo:hi], clen[lo:hi]
        sc = first[src[lo:hi], c[:, 0]]
        # Candidates are a few tokens long: score them one token at a time (the step kernel),
        # since a short multi-token forward is padded to a whole chunk (128 tokens on big models).
        for j in range(1, int(n.max())):
            step, rows = model(c[:, j - 1 : j], rows)
            lp = torch.log_softmax(step[:, -1].float(), -1).gather(1, c[:, j : j + 1]).squeeze(1)
            sc = sc + torch.where(j < n, lp, torch.zeros_like(lp))
        scores[lo:hi] = sc
    greedy = _greedy_rows(model, first_logits[:B], _take(q_state, torch.arange(B, device=device)), greedy_tokens, stop_ids)
    out, at = [], 0
    for b in range(B):
        C, i = len(candidate_ids[b]), answer_index[b]
        real, blank_sc = scores[at : at + C], scores[R + at : R + at + C]
        at += C
        said = decode(greedy[b])
        exact = bool(re.match(re.escape(answers[b]) + r"(?![0-9A-Za-z])", said.strip()))
        out.append(Answer(rank=_ranks(real, i), n_candidates=C, pick=int(real.argmax()), logp=float(real[i]),
                          blank_logp=float(blank_sc[i]), blank_rank=_ranks(blank_sc, i) if blank else 0, greedy=said, exact=exact,
                          contains=answers[b] in said))
    return out


def _ranks(scores: Tensor, index: int) -> int:
    return int((scores > scores[index]).sum()) + 1


def _greedy_rows(model: LaplaceModel, logits: Tensor, state: RecurrentState, budgets: Sequence[int], stop_ids: Sequence[int]) -> list[list[int]]:
    """Greedy tokens per row until a stop id or the row's budget; rows step together."""
    out: list[list[int]] = [[] for _ in budgets]
    live = [n > 0 for n in budgets]
    stops = set(stop_ids)
    for _ in range(max(budgets, default=0)):
        toks = logits.argmax(-1)
        for b, t in enumerate(toks.tolist()):
            if live[b]:
                if t in stops:
                    live[b] = False
                else:
                    out[b].append(t)
                    live[b] = len(out[b]) < budgets[b]
        if not any(live):
            break
        step, state = model(toks[:, None], state)
        logits = step[:, -1]
    return out


@torch.inference_mode()
def greedy_answer(model: LaplaceModel, state: RecurrentState, prompt: Sequence[int], n: int, stop_ids: Sequence[int] = ()) -> list[int]:
    """Greedy continuation of `prompt` read on top of `state` (which is left unchanged)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.embed.weight.device)
    logits, after = model(ids, state, last_only=True)
    return _greedy_rows(model, logits[:, -1], after, [n], stop_ids)[0]


@torch.inference_mode()
def greedy_rows(model: LaplaceModel, state: RecurrentState, prompts: Sequence[Sequence[int]], n: int,
                stop_ids: Sequence[int] = ()) -> list[list[int]]:
    """`greedy_answer` for every batch row of `state`, each row with its own prompt (their
    lengths may differ); `state` is left unchanged."""
    logits, after = advance_rows(model, state, prompts)
    if logits is None:
        raise ValueError("every row needs a non-empty prompt")
    return _greedy_rows(model, logits, after, [n] * len(prompts), stop_ids)
