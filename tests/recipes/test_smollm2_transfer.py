"""recipes/smollm2_hybrid/train/transfer.py and mix.py: the teacher pass is the teacher, the
training lowers the loss it reports, a resumed run is bit-identical to an uninterrupted one,
and the data mix is a pure function of (seed, index)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.runtime.model import build_model
from recipes.smollm2_hybrid.train.mix import Doc, SequenceMix, source_weights
from recipes.smollm2_hybrid.train.transfer import Plan, branch_tensors, load_checkpoint, make_optimizer, teacher_pass, train
from tests.runtime.test_window import window_config

T = 24


def tiny_plan(**kw) -> Plan:
    base = dict(seq_len=T, steps=100, steps_per_seq=2, lr=1e-2, mix_lr=5e-2, warmup=2, betas=(0.9, 0.99), clip=1.0,
                seed=3, temperature=0.7, multipliers={"b": 0.5}, checkpoint_every=2, eval_every=2, window=7, sinks=3,
                chunk=8, combine="softmax")
    return Plan(**{**base, **kw})


def tiny_model():
    return build_model(window_config(), seed=0).eval()  # the branch at its init: (almost) the window alone


def tiny_mix(length: int = T) -> SequenceMix:
    docs = [Doc("a", "the quick brown fox " * 9), Doc("a", "jumps over"), Doc("b", "lorem ipsum dolor " * 5)]
    encode = lambda s: [ord(c) % 60 for c in s]  # noqa: E731: a byte-ish tokenizer for a vocabulary of 64
    return SequenceMix(docs, encode, 63, length, seed=3, temperature=0.7, multipliers={"b": 0.5})


def test_teacher_pass_is_the_full_attention_model():
    model = tiny_model()
    ids = torch.tensor(tiny_mix().sequence(0))
    caches = teacher_pass(model, ids)
    full = build_model(window_config(window=T, gla_branch=False), seed=0).eval()
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out[0]))) for b in full.blocks]
    with torch.no_grad():
        full(ids[None])
    for h in hooks:
        h.remove()
    for (h, out), cache, block in zip(seen, caches, model.blocks):
        torch.testing.assert_close(cache["h"], h, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(block.attn.o_proj(cache["target"].reshape(1, T, -1)), out, rtol=1e-5, atol=1e-6)


def test_training_lowers_the_held_out_error_against_the_teacher(tmp_path: Path):
    model, mix = tiny_model(), tiny_mix()
    held = teacher_pass(model, torch.tensor(mix.sequence(99)))
    train(model, mix, tiny_plan(lr=5e-2, mix_lr=0.5), tmp_path, until=20, held=held, log=lambda s: None)
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 21))
    assert log[-1]["held_rel_mse"] < 0.8 * log[1]["held_rel_mse"]
    assert log[-1]["tokens_seen"] == 10 * T


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path: Path):
    plan = tiny_plan()
    one = tiny_model()
    train(one, tiny_mix(), plan, tmp_path / "one", until=7, log=lambda s: None)
    two = tiny_model()
    train(two, tiny_mix(), plan, tmp_path / "two", until=3, log=lambda s: None)  # stops mid-sequence (2 steps each)
    three = tiny_model()  # a new process: fresh model, fresh optimizer, fresh data reader
    assert not torch.equal(branch_tensors(three)["blocks.0.attn.gla_branch.q_map"],
                           branch_tensors(two)["blocks.0.attn.gla_branch.q_map"])
    train(three, tiny_mix(), plan, tmp_path / "two", until=7, log=lambda s: None)
    a, b = branch_tensors(one), branch_tensors(three)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_one, opt_two = make_optimizer(tiny_model(), plan), make_optimizer(tiny_model(), plan)
    load_checkpoint(tmp_path / "one", tiny_model(), opt_one, plan)
    load_checkpoint(tmp_path / "two", tiny_model(), opt_two, plan)
    for s1, s2 in zip(opt_one.state.values(), opt_two.state.values()):
        assert all(torch.equal(s1[k], s2[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_a_checkpoint_refuses_another_plan(tmp_path: Path):
    model = tiny_model()
    train(model, tiny_mix(), tiny_plan(), tmp_path, until=2, log=lambda s: None)
    with pytest.raises(ValueError, match="another plan"):
        load_checkpoint(tmp_path, tiny_model(), make_optimizer(tiny_model(), tiny_plan(lr=0.5)), tiny_plan(lr=0.5))


def test_sequences_are_a_function_of_seed_and_index():
    a, b = tiny_mix(), tiny_mix()
    seqs = [a.sequence(i) for i in range(20)]
    assert [b.sequence(i) for i in reversed(range(20))] == list(reversed(seqs))  # order of reads does not matter
    assert all(len(s) == T for s in seqs) and len({tuple(s) for s in seqs}) > 5
    long = tiny_mix(length=200)  # longer than any one document: joined with end-of-text
    assert 63 in long.sequence(0) and len(long.sequence(0)) == 200


def test_multipliers_turn_a_source_down():
    docs = [Doc("a", "x" * 100), Doc("b", "y" * 100)]
    assert source_weights(docs, 1.0, {}) == {"a": 0.5, "b": 0.5}
    w = source_weights(docs, 1.0, {"b": 0.25})
    assert w["b"] == pytest.approx(0.2) and sum(w.values()) == pytest.approx(1.0)


def test_export_swaps_in_exactly_the_trained_branch(tmp_path: Path):
    from safetensors.torch import load_file, save_file

    from recipes.smollm2_hybrid.train.export import branch_of_run, swap_into

    model = tiny_model()
    train(model, tiny_mix(), tiny_plan(), tmp_path / "run", until=2, log=lambda s: None)
    tensors, info = branch_of_run(tmp_path / "run")
    assert info["step"] == "2" and not any(k.startswith("adam.") for k in tensors)
    assert tensors.keys() == branch_tensors(model).keys()
    fresh = tiny_model().state_dict()
    (tmp_path / "m").mkdir()
    save_file({k: v.contiguous() for k, v in fresh.items()}, str(tmp_path / "m" / "model.safetensors"))
    swap_into(tmp_path / "m", tensors)
    got = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert got.keys() == fresh.keys()
    for k, v in got.items():
        assert torch.equal(v, tensors[k] if k in tensors else fresh[k])
    assert not torch.equal(got["blocks.1.attn.gla_branch.log_beta"], fresh["blocks.1.attn.gla_branch.log_beta"])
    with pytest.raises(ValueError, match="no tensor"):
        swap_into(tmp_path / "m", {"blocks.9.attn.gla_branch.log_beta": torch.zeros(4)})


def test_losses_read_in_segments_equal_one_pass():
    import torch.nn.functional as F

    from recipes.smollm2_hybrid.measure.perplexity import perplexity as ppl, token_losses, whole_and_tail

    model = tiny_model()
    ids = tiny_mix(length=40).sequence(1)
    with torch.no_grad():
        logits, _ = model(torch.tensor(ids)[None])
    expect = F.cross_entropy(logits[0, :-1], torch.tensor(ids[1:]), reduction="none")
    got = torch.tensor(token_losses(model, ids, segment=9))
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    assert ppl([got.tolist()], 10, 20) == pytest.approx(float(expect[10:20].mean().exp()), rel=1e-5)
    # The measurements' (whole, tail) pair is the same losses, not a second computation.
    whole, tail = whole_and_tail(model, ids, 7)
    assert whole == pytest.approx(float(expect.mean().exp()), rel=1e-5)
    assert tail == pytest.approx(float(expect[-7:].mean().exp()), rel=1e-5)


def test_training_and_the_combine_measurement_report_one_relative_mse():
    from recipes.smollm2_hybrid.measure.combine import held_relative_mse
    from recipes.smollm2_hybrid.train.transfer import held_relative_mse as transfer_relative_mse

    model = tiny_model()
    caches = teacher_pass(model, torch.tensor(tiny_mix(length=40).sequence(0)))
    start = model.config.sinks + model.config.window
    one = model.blocks[:1]  # one layer: a ratio of sums and a mean of ratios must agree
    single = type("One", (), {"blocks": one})()
    assert held_relative_mse(single, caches[:1], start) == pytest.approx(transfer_relative_mse(single, caches[:1], start), abs=1e-4)


def test_held_out_picks_follow_the_held_out_text(tmp_path: Path):
    from recipes.smollm2_hybrid.measure.evaluate import held_out_docs

    rows = [{"source": "small", "doc_id": "small#1", "text": "a b " * 40},
            {"source": "big", "doc_id": "big#1", "text": "too short"},
            {"source": "big", "doc_id": "big#2", "text": "c d " * 50},
            {"source": "big", "doc_id": "big#3", "text": "e f " * 50}]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    encode = lambda s: s.split()  # noqa: E731
    picked = held_out_docs(tmp_path, encode, 20, 5)
    assert [d for d, _ in picked] == ["big#2", "small#1"] and all(len(ids) == 20 for _, ids in picked)
    assert [d for d, _ in held_out_docs(tmp_path, encode, 20, 1)] == ["big#2"]
