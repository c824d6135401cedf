"""`ask_rows` reads a distractor only while it could still outrank the answer: the ranks,
picks and log-probs stay those of scoring every candidate in full, for less work."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from agent.probes import text
from agent.probes.engine import advance_rows, ask_rows
from agent.probes.tasks import PromptBuilder, build_sample, candidates


class Leaning(nn.Module):
    """A model that leans by `bonus` nats towards the token that follows the input token in
    one of the `paths`: a stand-in for a model that remembers (each next token of the answer
    is likely, a distractor's mostly not). It counts the rows of every forward call."""

    def __init__(self, inner: nn.Module, paths: list[list[int]], bonus: float) -> None:
        super().__init__()
        self.inner, self.bonus = inner, bonus
        self.next: dict[int, set[int]] = {}
        for p in paths:
            for a, b in zip(p, p[1:]):
                self.next.setdefault(a, set()).add(b)
        self.calls: list[tuple[int, int]] = []  # (rows, tokens) of each forward call
        self.steps = 0  # greedy decode steps

    @property
    def embed(self) -> nn.Module:
        return self.inner.embed

    @property
    def config(self):  # type: ignore[no-untyped-def]
        return self.inner.config

    def new_state(self, batch: int = 1):  # type: ignore[no-untyped-def]
        return self.inner.new_state(batch)

    def _lean(self, ids: Tensor, logits: Tensor) -> Tensor:
        logits = logits.clone()
        at = ids[:, -logits.shape[1]:]  # the input token each row of logits follows
        for b in range(at.shape[0]):
            for t in range(at.shape[1]):
                for n in self.next.get(int(at[b, t]), ()):
                    logits[b, t, n] += self.bonus
        return logits

    def forward(self, ids: Tensor, state=None, *, lengths=None, last_only=False):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(ids.shape))
        logits, state = self.inner(ids, state, lengths=lengths, last_only=last_only)
        if last_only and lengths is not None:  # each row's last real token
            at = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])
            return self._lean(at, logits), state
        return self._lean(ids, logits), state

    def step_(self, tokens: Tensor, state) -> Tensor:  # type: ignore[no-untyped-def]
        self.steps += 1
        return self._lean(tokens[:, None], self.inner.step_(tokens, state)[:, None])[:, 0]


def _full_scores(model: nn.Module, state, question: list[int], ids: list[list[int]]) -> list[float]:  # type: ignore[no-untyped-def]
    """Every candidate scored by one plain forward over question + candidate (no pruning)."""
    out = []
    with torch.inference_mode():
        for c in ids:
            logits, _ = model(torch.tensor([question + c]), state)
            lp = torch.log_softmax(logits[0, len(question) - 1 : -1].float(), -1)
            out.append(float(lp.gather(1, torch.tensor(c)[:, None]).sum()))
    return out


def _greedy(model: nn.Module, state, question: list[int], n: int, stops: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    got: list[int] = []
    with torch.inference_mode():
        logits, state = model(torch.tensor([question]), state)
        while len(got) < n:
            t = int(logits[0, -1].argmax())
            if t in stops:
                break
            got.append(t)
            logits, state = model(torch.tensor([[t]]), state)
    return got


# Trials 0, 1, 2 plant digits, a word pair and a hex id.
@pytest.mark.parametrize("bonus", [0.0, 4.0, 40.0], ids=["chance", "leaning", "remembers"])
def test_pruned_asking_equals_scoring_every_candidate(random_tiny, bonus):
    lm = random_tiny
    pb = PromptBuilder(lm.tokenizer, lm.template, "chat")
    samples = [build_sample("passkey", text.rng_of(t, "prune"), pb, t) for t in range(3)]
    cands = [candidates(s, text.rng_of("c", i), pb) for i, s in enumerate(samples)]
    ids = [[pb.answer_ids(c) for c in cs] for cs in cands]
    model = Leaning(lm.model, [s.question[-1:] + pb.answer_ids(s.answer) for s in samples], bonus)
    _, state = advance_rows(model, model.new_state(len(samples)), [s.prefix + s.plant for s in samples])
    stops = lm.template.stop_ids(lm.tokenizer)
    model.calls.clear()
    B = len(samples)
    got = ask_rows(model, state, [s.question for s in samples], ids, [c.index(s.answer) for c, s in zip(cands, samples)],
                   decode=lm.tokenizer.decode, answers=[s.answer for s in samples],
                   greedy_tokens=[len(i[0]) + 2 for i in ids], stop_ids=stops)
    work = sum(b for b, t in model.calls)
    for b, (s, c, i, a) in enumerate(zip(samples, cands, ids, got)):
        k = c.index(s.answer)
        real = _full_scores(model, state.index_select(torch.tensor([b])), s.question, i)
        blank = _full_scores(model, model.new_state(1), s.question, i)
        assert a.logp == pytest.approx(real[k], abs=1e-3) and a.blank_logp == pytest.approx(blank[k], abs=1e-3)
        assert a.rank == 1 + sum(x > real[k] for x in real)
        assert a.blank_rank == 1 + sum(x > blank[k] for x in blank)
        assert a.pick == max(range(len(real)), key=real.__getitem__)
        want = _greedy(model, state.index_select(torch.tensor([b])), s.question, len(i[0]) + 2, stops)
        assert a.greedy == lm.tokenizer.decode(want)
    # Rows read: the question on 2B rows (real and blank), each row's true answer, the
    # distractors still in the running and the greedy answers that leave the true answer's
    # path; in full, 2B * 19 distractor rows.
    if bonus == 40.0:
        assert [a.rank for a in got] == [1] * B
        assert work <= 2 * B + 2 * B + B + 2 * B * 19 // 4, model.calls  # most distractors were never read


def test_a_blank_control_asked_first_or_not_agrees_and_reads_less(random_tiny):
    # Random weights: every question is at chance, the blank control's usual place.
    lm = random_tiny
    pb = PromptBuilder(lm.tokenizer, lm.template, "chat")
    samples = [build_sample("passkey", text.rng_of(t, "first"), pb, t) for t in range(6)]
    cands = [candidates(s, text.rng_of("c", i), pb) for i, s in enumerate(samples)]
    ids = [[pb.answer_ids(c) for c in cs] for cs in cands]
    model = Leaning(lm.model, [], 0.0)
    _, state = advance_rows(model, model.new_state(len(samples)), [s.prefix + s.plant for s in samples])
    runs = {}
    for first_only in (False, True):
        model.calls.clear()
        got = ask_rows(model, state, [s.question for s in samples], ids, [c.index(s.answer) for c, s in zip(cands, samples)],
                       decode=lm.tokenizer.decode, answers=[s.answer for s in samples], greedy_tokens=[4] * len(samples),
                       blank_first_only=first_only)
        runs[first_only] = (got, sum(b for b, _ in model.calls))
    (exact, work_exact), (first, work_first) = runs[False], runs[True]
    assert [a.blank_rank == 1 for a in first] == [a.blank_rank == 1 for a in exact]
    assert all(f.blank_rank <= e.blank_rank for f, e in zip(first, exact))  # a lower bound when not first
    assert [(a.rank, a.pick) for a in first] == [(a.rank, a.pick) for a in exact]
    assert [a.logp for a in first] == pytest.approx([a.logp for a in exact], abs=1e-4)
    assert work_first < work_exact
