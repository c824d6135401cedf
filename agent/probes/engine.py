"""Asking a state: forced choice, greedy answer and blank-state control in one batch.

`ask` never modifies the state it is given (the model's forward returns new tensors), so
a sweep asks at a distance and keeps reading filler from the same state: one pass over the
filler serves every distance. The blank control is the same question on a state that has
read nothing, batched beside the real one.

Cost (what made a smoke run take 15 minutes on the 135 M default model): a call's cost is
mostly copying its rows' state (21 MB a row there), whatever its length. So a question is
a few calls over many rows, never a call per candidate token: the true answers first, then
only the distractors that could still outrank them, in one call per ~128 MB of rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

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
    blank_rank: int  # (asked with blank_first_only: 1, or a lower bound when not first)
    greedy: str  # decoded greedy continuation of the cue
    exact: bool  # the greedy continuation starts with the answer
    contains: bool  # the answer appears anywhere in it

    @property
    def top1(self) -> bool:
        return self.rank == 1

    @property
    def lift(self) -> float:
        return self.logp - self.blank_logp


ROW_BYTES = 128 << 20  # one scoring call holds at most ~128 MB of rows' state: peak memory stays bounded
FIRST_ONLY_STEP = 2  # blank rivals read per row per call when only "first or not" is wanted


def _pad(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids, torch.tensor([len(r) for r in rows], device=device)


def _take(state: RecurrentState, index: Tensor) -> RecurrentState:
    return state.index_select(index)


class Stopped(Exception):
    """`ask_rows` was told to stop (a deadline) before it finished; nothing it did is kept."""


def _paths(model: LaplaceModel, state: RecurrentState, src: Sequence[int], paths: Sequence[Sequence[int]],
           stop: Callable[[], bool] | None = None) -> Iterator[tuple[int, Tensor]]:
    """Read path i on a copy of row src[i] of `state` and yield (i, log-probs [len(path), V]),
    row j being the distribution after path[: j + 1]. Paths go in multi-token calls of at
    most ROW_BYTES of state each, never one call per token (a call's cost is mostly
    copying its rows' state, whatever its length)."""
    device = model.embed.weight.device
    per = max(1, ROW_BYTES // max(1, state.nbytes // max(1, state.batch_size)))
    for lo in range(0, len(paths), per):
        if stop is not None and stop():
            raise Stopped
        part = paths[lo : lo + per]
        ids, lens = _pad(part, device)
        ragged = bool((lens != ids.shape[1]).any())
        rows = list(src[lo : lo + per])
        # Every row of `state` in order: read it as it is (the model never writes its input).
        on = state if rows == list(range(state.batch_size)) else _take(state, torch.tensor(rows, device=device))
        logits, _ = model(ids, on, lengths=lens if ragged else None)
        for i, p in enumerate(part):
            yield lo + i, torch.log_softmax(logits[i, : len(p)].float(), -1)


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
    stop: Callable[[], bool] | None = None,
    blank_first_only: bool = False,
) -> list[Answer]:
    """Ask each batch row of `state` its own question; score its candidates' tokens after
    the question on the row and (with `blank`) on a blank state, and decode a greedy answer.

    The blank control depends only on the question and candidates, so a sweep asking the
    same ones at many distances computes it once (`blank=False` leaves its fields NaN / 0).
    A row's candidates must share one token length (their summed log-probs are compared);
    lengths may differ between rows.

    The cost is a few calls over the rows, not one per candidate token: the true answers
    are read first, in one call. A distractor's summed log-prob can only fall as its tokens
    are added, so one whose tokens up to where it leaves the true answer's path already
    score below the true answer can neither outrank it nor be the pick, and is not read
    further (rank, pick and log-probs stay exact). The rest are read in one call. The
    greedy answer follows the true answer's path as long as its argmax does, and only the
    tokens after that are decoded step by step.

    `stop` (a deadline) is asked between calls; when it says so, `Stopped` is raised.
    `blank_first_only`: the blank control need only say whether the blank state ranks the
    answer first (a sweep reports just that); its rank is then 1, or a lower bound >= 2,
    and the blank's rivals are read only until one outscores the answer (at chance, the
    blank control's usual place, that saves most of its reads)."""
    B = len(questions)
    for c in candidate_ids:
        if len({len(x) for x in c}) != 1 or 0 in {len(x) for x in c}:
            raise ValueError("a row's candidates must be non-empty and share one token length")
    K = 2 if blank else 1
    rows = K * B
    both = RecurrentState.stack([state, RecurrentState.zeros(model.config, B, state.device)]) if blank else state
    first_logits, q_state = advance_rows(model, both, list(questions) * K)  # B real rows, then B blank
    first = torch.log_softmax(first_logits.float(), -1)  # [KB, V]
    truth = [list(candidate_ids[r % B][answer_index[r % B]]) for r in range(rows)]
    # Along each row's true answer: lp[j] is the distribution before truth[j] (j <= L: the
    # last one is after the whole answer, where the greedy answer goes on).
    along: list[Tensor] = [first[r : r + 1] for r in range(rows)]
    for r, lp in _paths(model, q_state, range(rows), truth, stop):
        along[r] = torch.cat([along[r], lp])
    scores = [[math.nan] * len(candidate_ids[r % B]) for r in range(rows)]
    rest: list[tuple[int, int]] = []  # (row, candidate) still to read
    bounds: dict[tuple[int, int], float] = {}
    for r in range(rows):
        t, lp = truth[r], along[r]
        prefix = _running(lp[torch.arange(len(t)), torch.tensor(t)].tolist())
        best = prefix[-1]
        for k, c in enumerate(candidate_ids[r % B]):
            if k == answer_index[r % B]:
                scores[r][k] = best
                continue
            j = next((i for i, (a, b) in enumerate(zip(c, t)) if a != b), None)  # where it leaves the path
            if j is None:  # the same tokens as the answer (two spellings of one value)
                scores[r][k] = best
                continue
            bound = prefix[j] + float(lp[j, c[j]])
            if bound < best or len(c) == j + 1:
                scores[r][k] = bound  # exact when it ends there; else a bound below the answer
            else:
                rest.append((r, k))
                bounds[r, k] = bound

    def read(items: list[tuple[int, int]]) -> None:
        """Score these (row, candidate)s in full; rivals with the same tokens before their
        last one (same row) share one read."""
        paths: dict[tuple[int, tuple[int, ...]], list[tuple[int, int]]] = {}
        for r, k in items:
            paths.setdefault((r, tuple(candidate_ids[r % B][k][:-1])), []).append((r, k))
        keys = list(paths)
        for i, lp in _paths(model, q_state, [r for r, _ in keys], [list(p) for _, p in keys], stop):
            for r, k in paths[keys[i]]:
                c = candidate_ids[r % B][k]
                scores[r][k] = _running([float(first[r, c[0]])] + lp[torch.arange(len(c) - 1), torch.tensor(c[1:])].tolist())[-1]

    if not (blank and blank_first_only):
        read(rest)
    else:
        read([x for x in rest if x[0] < B])
        # Blank rows: only "first or not" is wanted. Rivals are read best bound first, a few
        # per row at a time, and a row stops at the first that outscores its answer.
        queue = {r: sorted((x for x in rest if x[0] == r), key=lambda x: -bounds[x]) for r in range(B, rows)}
        while any(queue.values()):
            batch = [x for r in queue for x in queue[r][:FIRST_ONLY_STEP]]
            for r in queue:
                queue[r] = queue[r][FIRST_ONLY_STEP:]
            read(batch)
            for r in queue:
                best = scores[r][answer_index[r % B]]
                if any(x > best for x in scores[r] if not math.isnan(x)):
                    queue[r] = []  # not first: its other rivals stay unread (NaN)
    if stop is not None and stop():
        raise Stopped
    greedy = _greedy_along(model, q_state, along[:B], truth[:B], greedy_tokens, stop_ids)
    out = []
    for b in range(B):
        i = answer_index[b]
        real = torch.tensor(scores[b], dtype=torch.float64)
        blank_sc = torch.tensor(scores[B + b], dtype=torch.float64) if blank else torch.full_like(real, math.nan)
        said = decode(greedy[b])
        exact = bool(re.match(re.escape(answers[b]) + r"(?![0-9A-Za-z])", said.strip()))
        out.append(Answer(rank=_ranks(real, i), n_candidates=len(real), pick=int(real.argmax()), logp=float(real[i]),
                          blank_logp=float(blank_sc[i]), blank_rank=_ranks(blank_sc, i) if blank else 0, greedy=said, exact=exact,
                          contains=answers[b] in said))
    return out


def _running(steps: Sequence[float]) -> list[float]:
    """[0, s0, s0 + s1, ...] in float64, added in one order for the answer and its rivals."""
    out = [0.0]
    for x in steps:
        out.append(out[-1] + x)
    return out


def _greedy_along(model: LaplaceModel, state: RecurrentState, along: Sequence[Tensor], truth: Sequence[Sequence[int]],
                  budgets: Sequence[int], stop_ids: Sequence[int]) -> list[list[int]]:
    """Greedy tokens per row of `state` (stopping at a stop id or the row's budget), taken
    from the log-probs `along` each row's true answer while the argmax follows it; rows
    that leave it (or outrun it) re-read their tokens in one call and step from there."""
    stops = set(stop_ids)
    out: list[list[int]] = [[] for _ in budgets]
    going: list[int] = []
    for b, (lp, t) in enumerate(zip(along, truth)):
        done = budgets[b] <= 0
        while not done:
            n = len(out[b])
            if n > len(t) or (n and out[b][-1] != t[n - 1]):  # off the path: the model must read on
                going.append(b)
                break
            tok = int(lp[n].argmax())
            if tok in stops:
                break
            out[b].append(tok)
            done = len(out[b]) >= budgets[b]
    if going:
        device = model.embed.weight.device
        logits, after = advance_rows(model, _take(state, torch.tensor(going, device=device)), [out[b] for b in going])
        more = _greedy_rows(model, logits, after, [budgets[b] - len(out[b]) for b in going], stop_ids)
        for b, m in zip(going, more):
            out[b] += m
    return out


def _ranks(scores: Tensor, index: int) -> int:
    return int((scores > scores[index]).sum()) + 1


def _greedy_rows(model: LaplaceModel, logits: Tensor, state: RecurrentState, budgets: Sequence[int], stop_ids: Sequence[int]) -> list[list[int]]:
    """Greedy tokens per row until a stop id or the row's budget; rows step together.
    `state` must be the caller's own (it is stepped in place)."""
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
        logits = model.step_(toks, state)  # the lean decode step: `state` is ours (a fresh one), written in place
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
