"""Asking a state: forced choice, greedy answer and blank-state control in one batch.

`ask` never modifies the state it is given (the model's forward returns new tensors), so
a sweep asks at a distance and keeps reading filler from the same state: one pass over the
filler serves every distance. The blank control is the same question on a state that has
read nothing, batched beside the real one.
"""

from __future__ import annotations

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


def _rows(state: RecurrentState, repeats: int) -> RecurrentState:
    return RecurrentState(state.gla.repeat_interleave(repeats, dim=1), state.conv.repeat_interleave(repeats, dim=1))


def _ranks(scores: Tensor, index: int) -> int:
    return int((scores > scores[index]).sum()) + 1


@torch.inference_mode()
def advance(model: LaplaceModel, state: RecurrentState, ids: Sequence[int], segment: int = SEGMENT) -> tuple[Tensor | None, RecurrentState]:
    """Fold `ids` into a batch-1 state in fixed segments; returns (last logits [V] or None, state)."""
    logits = None
    device = model.embed.weight.device
    n0 = state.n_tokens
    for start in range(0, len(ids), segment):
        seg = torch.tensor([list(ids[start : start + segment])], dtype=torch.long, device=device)
        out, state = model(seg, state, last_only=True)
        logits = out[0, -1]
    state.n_tokens = n0 + len(ids)
    return logits, state


@torch.inference_mode()
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
    """Score every candidate's tokens after `question` on `state` and on a blank state.

    Candidates must share one token length (their summed log-probs are compared)."""
    lengths = {len(c) for c in candidate_ids}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError("candidates must be non-empty and share one token length")
    device = model.embed.weight.device
    C, L = len(candidate_ids), lengths.pop()
    both = RecurrentState.stack([state, model.new_state(1)])
    q = torch.tensor([list(question)] * 2, dtype=torch.long, device=device)
    q_logits, q_state = model(q, both, last_only=True)
    first = torch.log_softmax(q_logits[:, -1].float(), -1)  # [2, V]
    cand = torch.tensor([list(c) for c in candidate_ids], dtype=torch.long, device=device)  # [C, L]
    scores = first[:, cand[:, 0]]  # [2, C]
    if L > 1:
        c_logits, _ = model(cand[:, :-1].repeat(2, 1), _rows(q_state, C))  # rows: C real, then C blank
        lp = torch.log_softmax(c_logits.float(), -1).view(2, C, L - 1, -1)
        scores = scores + lp.gather(3, cand[None, :, 1:, None].expand(2, C, L - 1, 1)).squeeze(-1).sum(-1)
    real, blank = scores[0], scores[1]
    greedy = _greedy(model, q_logits[0, -1], q_state.select(0), greedy_tokens, stop_ids)
    said = decode(greedy)
    stripped = said.strip()
    exact = bool(re.match(re.escape(answer) + r"(?![0-9A-Za-z])", stripped))
    return Answer(
        rank=_ranks(real, answer_index), n_candidates=C, pick=int(real.argmax()), logp=float(real[answer_index]),
        blank_logp=float(blank[answer_index]), blank_rank=_ranks(blank, answer_index), greedy=said,
        exact=exact, contains=answer in said,
    )


def _greedy(model: LaplaceModel, logits: Tensor, state: RecurrentState, n: int, stop_ids: Sequence[int]) -> list[int]:
    out: list[int] = []
    device = logits.device
    for _ in range(n):
        tok = int(logits.argmax())
        if tok in stop_ids:
            break
        out.append(tok)
        step, state = model(torch.tensor([[tok]], dtype=torch.long, device=device), state)
        logits = step[0, -1]
    return out


@torch.inference_mode()
def greedy_answer(model: LaplaceModel, state: RecurrentState, prompt: Sequence[int], n: int, stop_ids: Sequence[int] = ()) -> list[int]:
    """Greedy continuation of `prompt` read on top of `state` (which is left unchanged)."""
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.embed.weight.device)
    logits, after = model(ids, state, last_only=True)
    return _greedy(model, logits[0, -1], after, n, stop_ids)
