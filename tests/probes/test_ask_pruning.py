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
    """A model whose logits lean towards `favoured` tokens by `bonus` nats: a stand-in for a
    model that remembers (the answer's tokens are likely, a distractor's mostly not). It
    counts the rows and tokens of every call."""

    def __init__(self, inner: nn.Module, favoured: list[int], bonus: float) -> None:
        super().__init__()
        self.inner, self.favoured, self.bonus = inner, torch.tensor(sorted(set(favoured))), bonus
        self.calls: list[tuple[int, int]] = []

    @property
    def embed(self) -> nn.Module:
        return self.inner.embed

    @property
    def config(self):  # type: ignore[no-untyped-def]
        return self.inner.config

    def new_state(self, batch: int = 1):  # type: ignore[no-untyped-def]
        return self.inner.new_state(batch)

    def _lean(self, logits: Tensor) -> Tensor:
        logits = logits.clone()
        logits[..., self.favoured] += self.bonus
        return logits

    def forward(self, ids: Tensor, state=None, **kw):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(ids.shape))
        logits, state = self.inner(ids, state, **kw)
        return self._lean(logits), state

    def step_(self, tokens: Tensor, state) -> Tensor:  # type: ignore[no-untyped-def]
        self.calls.append((tokens.shape[0], 1))
        return self._lean(self.inner.step_(tokens, state))


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


@pytest.mark.parametrize("bonus", [0.0, 4.0, 40.0], ids=["chance", "leaning", "remembers"])
def test_pruned_asking_equals_scoring_every_candidate(random_tiny, bonus):
    lm = random_tiny
    pb = PromptBuilder(lm.tokenizer, lm.template, "chat")
    samples = [build_sample(p, text.rng_of(p, "prune"), pb, t) for t, p in enumerate(["passkey", "passkey", "multikey-4"])]
    cands = [candidates(s, text.rng_of("c", i), pb) for i, s in enumerate(samples)]
    ids = [[pb.answer_ids(c) for c in cs] for cs in cands]
    model = Leaning(lm.model, [t for s in samples for t in pb.answer_ids(s.answer)], bonus)
    _, state = advance_rows(model, model.new_state(3), [s.prefix + s.plant for s in samples])
    stops = lm.template.stop_ids(lm.tokenizer)
    model.calls.clear()
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
    # Rows read: the question on 6 rows (3 real, 3 blank), each row's true answer, and the
    # distractors still in the running; in full that is 6 + 6 * 20 rows plus the greedy steps.
    if bonus == 40.0:
        assert work <= 6 + 6 + 6 * 20 // 2, model.calls  # most distractors were never read
