"""Asking a state, and the probes only a fixed state allows, on untrained and random weights."""

from __future__ import annotations

import math

import pytest
import torch

from agent.probes import text
from agent.probes.engine import advance, ask
from agent.probes.fillers import make_filler
from agent.probes.ledger import counterfactual_trace, resume_check, retention_ledger
from agent.recall.decays import capture_decays
from agent.probes.tasks import PromptBuilder, build_sample, candidates


def _setup(lm, filler="grammar", n=600):
    pb = PromptBuilder(lm.tokenizer, lm.template, "completion")
    s = build_sample("passkey", text.rng_of("t"), pb, 0)
    fill = make_filler(filler, lm.tokenizer, lm.template).tokens(n, text.rng_of("f"))
    return pb, s, fill


def test_ask_scores_match_a_full_forward_and_leave_the_state_alone(random_tiny):
    lm, m = random_tiny, random_tiny.model
    pb, s, fill = _setup(lm)
    _, state = advance(m, m.new_state(1), s.prefix + s.plant + fill[:100])
    before = state.clone()
    cands = candidates(s, text.rng_of("c"), pb)
    ids = [pb.answer_ids(c) for c in cands]
    a = ask(m, state, s.question, ids, cands.index(s.answer), decode=lm.tokenizer.decode, answer=s.answer,
            greedy_tokens=4)
    assert torch.equal(state.gla, before.gla) and torch.equal(state.conv, before.conv)
    # Reference: score each candidate by one plain forward over question + candidate.
    ref = []
    with torch.inference_mode():
        for c in ids:
            logits, _ = m(torch.tensor([s.question + c]), state)
            lp = torch.log_softmax(logits[0, len(s.question) - 1 : -1], -1)
            ref.append(float(lp.gather(1, torch.tensor(c)[:, None]).sum()))
    i = cands.index(s.answer)
    assert a.logp == pytest.approx(ref[i], abs=1e-3)
    assert a.rank == 1 + sum(r > ref[i] for r in ref)
    assert a.pick == max(range(len(ref)), key=ref.__getitem__)
    with torch.inference_mode():
        logits, _ = m(torch.tensor([s.question + ids[i]]), m.new_state(1))
        lp = torch.log_softmax(logits[0, len(s.question) - 1 : -1], -1)
    assert a.blank_logp == pytest.approx(float(lp.gather(1, torch.tensor(ids[i])[:, None]).sum()), abs=1e-3)


def test_ledger_recovers_the_configured_half_lives_on_an_untrained_model(tiny):
    # Untrained: decay weights are zero, so every head decays at exactly its scheduled rate.
    _, s, fill = _setup(tiny, n=256)
    with capture_decays(tiny.model) as rec:
        advance(tiny.model, tiny.model.new_state(1), fill)
    led = retention_ledger(rec.take()[:, 0], [0, 64, 256])
    want = tiny.config.half_lives()
    for layer in led["half_life"]:
        assert layer == pytest.approx(want, rel=1e-4)
    assert led["slowest"]["half_life"] == pytest.approx(max(want), rel=1e-4)
    assert led["slowest_retention"]["256"] == pytest.approx(0.5 ** (256 / max(want)), rel=1e-3)
    assert led["horizon"] == pytest.approx(max(want) * math.log2(1000), rel=1e-3)
    # Hooks are removed afterwards.
    assert all(not b.attn.decay_tap._forward_hooks for b in tiny.model.blocks)


def test_counterfactual_self_test_holds_on_random_weights(random_tiny):
    lm, m = random_tiny, random_tiny.model
    pb, s, fill = _setup(lm)
    other = "12345" if s.answer != "12345" else "54321"
    a = s.prefix + s.plant
    b = s.prefix + pb.statement(f"The code for the {s.key} is {other}.")
    tr = counterfactual_trace(m, a, b, fill, [0, 64, 128, 256, 512], s.question, pb.answer_ids(s.answer))
    st = tr["self_test"]
    assert st["passed"] and st["checked"] >= 4, st
    # The difference fades: the slow head of layer 0 keeps less at 512 than at 64.
    first, last = tr["rows"][0]["state_diff"][0], tr["rows"][-1]["state_diff"][0]
    assert max(last) < max(first)


def test_counterfactual_needs_streams_that_differ_only_in_value(tiny):
    pb, s, fill = _setup(tiny)
    with pytest.raises(ValueError, match="identical"):
        counterfactual_trace(tiny.model, s.plant, s.plant, fill, [64], s.question, [1])
    with pytest.raises(ValueError, match="same token length"):
        counterfactual_trace(tiny.model, s.plant, s.plant + [1], fill, [64], s.question, [1])


def test_resume_check_passes(random_tiny):
    _, s, fill = _setup(random_tiny, n=300)
    r = resume_check(random_tiny.model, s.plant + fill, random_tiny.fingerprint)
    assert r["passed"] and r["max_abs_diff"] == 0.0


def test_batched_rows_of_different_lengths_answer_as_if_asked_alone(random_tiny):
    from agent.probes.engine import advance_rows, ask_rows

    lm, m = random_tiny, random_tiny.model
    pb = PromptBuilder(lm.tokenizer, lm.template, "chat")
    samples = [build_sample(p, text.rng_of(p), pb, t) for t, p in enumerate(["passkey", "multikey-4", "passkey"])]
    cands = [candidates(s, text.rng_of("c", i), pb) for i, s in enumerate(samples)]
    ids = [[pb.answer_ids(c) for c in cs] for cs in cands]
    assert len({len(i[0]) for i in ids}) > 1  # digits, then a word pair: ragged candidate lengths
    _, state = advance_rows(m, m.new_state(3), [s.prefix + s.plant for s in samples])
    together = ask_rows(m, state, [s.question for s in samples], ids, [c.index(s.answer) for c, s in zip(cands, samples)],
                        decode=lm.tokenizer.decode, answers=[s.answer for s in samples], greedy_tokens=[6, 6, 6])
    for s, c, i, got in zip(samples, cands, ids, together):
        _, alone_state = advance(m, m.new_state(1), s.prefix + s.plant)
        alone = ask(m, alone_state, s.question, i, c.index(s.answer), decode=lm.tokenizer.decode, answer=s.answer,
                    greedy_tokens=6)
        assert (got.rank, got.blank_rank, got.pick, got.greedy) == (alone.rank, alone.blank_rank, alone.pick, alone.greedy)
        assert got.logp == pytest.approx(alone.logp, abs=1e-3) and got.blank_logp == pytest.approx(alone.blank_logp, abs=1e-3)


def test_counterfactual_with_nothing_to_check_says_so_rather_than_failing(random_tiny):
    lm, m = random_tiny, random_tiny.model
    pb, s, fill = _setup(lm)
    other = "12345" if s.answer != "12345" else "54321"
    a = s.prefix + s.plant
    b = s.prefix + pb.statement(f"The code for the {s.key} is {other}.")
    tr = counterfactual_trace(m, a, b, fill, [0], s.question, pb.answer_ids(s.answer))  # only inside the conv window
    assert tr["self_test"]["checked"] == 0 and tr["self_test"]["passed"] is None
