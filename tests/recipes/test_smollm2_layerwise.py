"""recipes/smollm2_hybrid/train/layerwise.py: the cached target is the teacher's, the cache is
written whole and resumably and refused for another model or length, the window part with a
memory is the layer's own forward, training lowers a layer's held-out error, and a run stopped
midway and resumed is bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agent.runtime.model import build_model
from agent.runtime.state_spec import memory_slots_of, window_state_spec
from recipes.smollm2_hybrid.train.attention import branch_output, full_attention, layer_cache
from recipes.smollm2_hybrid.train.layerwise import (Plan, build_cache, cache_identity, parse_layers, read_manifest,
                                                    teacher_tensors, train, window_of)
from recipes.smollm2_hybrid.train.mix import Doc, SequenceMix
from recipes.smollm2_hybrid.train.transfer import branch_tensors, teacher_pass
from tests.runtime.test_memory import NW
from tests.runtime.test_window import window_config, window_model

T = 32
MEMORY = dict(memory_slots=3, memory_policy="novelty", window=NW, memory_layers=(1,), memory_rest_slots=2)


def tiny_plan(**kw) -> Plan:
    base = dict(seq_len=T, windows={"7": 0.5, "4": 0.5}, lr=5e-2, mix_lr=0.5, betas=(0.9, 0.99), clip=1.0, warmup=2, epochs=3,
                seed=3, temperature=0.7, multipliers={"b": 0.5}, checkpoint_every=2)
    return Plan(**{**base, **kw})


def tiny_model(**kw):
    return build_model(window_config(vocab_size=272, **kw), seed=0).eval()  # the branch at its init


def docs() -> list[Doc]:
    return [Doc("a", "the quick brown fox jumps over the lazy dog " * 4), Doc("a", "jumps over"),
            Doc("b", "lorem ipsum dolor sit amet " * 5)]


def mixes(plan: Plan) -> dict[str, SequenceMix]:
    encode = lambda s: [ord(c) % 250 for c in s]  # noqa: E731: byte-ish ids for a vocabulary of 272
    kw = dict(seed=plan.seed, temperature=plan.temperature, multipliers=plan.multipliers)
    return {"train": SequenceMix(docs(), encode, 264, plan.seq_len, **kw),
            "heldout": SequenceMix(docs()[::-1], encode, 264, plan.seq_len, **kw)}


def write_plan(path: Path, plan: Plan) -> Path:
    path.write_text(json.dumps({"_why": "a test plan", **asdict(plan)}))
    return path


def make_cache(model, path: Path, plan: Plan, seqs: int = 6, heldout: int = 2) -> int:
    return build_cache(model, mixes(plan), {"train": seqs, "heldout": heldout}, path,
                       cache_identity(model, "w", plan, plan.seq_len), log=lambda s: None)


def test_fast_target_is_layer_caches_target_and_the_teacher_pass():
    model = tiny_model()
    ids = torch.tensor(mixes(tiny_plan())["train"].sequence(0))
    caches = teacher_pass(model, ids)
    cached = teacher_tensors(model, ids)
    for i, (block, c) in enumerate(zip(model.blocks, caches)):
        torch.testing.assert_close(full_attention(block.attn, c["h"][0]), layer_cache(block.attn, c["h"][0])["target"],
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(cached[f"h.{i}"].float(), c["h"][0], rtol=1e-2, atol=1e-2)  # bf16 of the same stream
        torch.testing.assert_close(cached[f"y.{i}"].float(), c["target"].reshape(T, -1), rtol=1e-2, atol=1e-2)
        assert cached[f"h.{i}"].dtype == cached[f"y.{i}"].dtype == torch.bfloat16
    assert torch.equal(cached["ids"], ids)


@pytest.mark.parametrize("kw", [dict(), MEMORY], ids=["no-memory", "novelty-memory"])
def test_the_window_part_with_a_memory_is_the_layers_own_forward(kw):
    model = window_model(vocab_size=272, **kw)  # the branch far from its init
    h = torch.randn(1, 40, model.config.d_model)
    for i, block in enumerate(model.blocks):
        c = block.attn.config
        state = {n: torch.zeros(s, dtype=getattr(torch, d)) for n, (s, d) in window_state_spec(c, 1, i).items()}
        want, _ = block.attn(h, state, None, torch.zeros(1, dtype=torch.long))
        y = branch_output(block.attn, layer_cache(block.attn, h[0], memory_slots=memory_slots_of(c, i)))
        torch.testing.assert_close(block.attn.o_proj(y.reshape(1, 40, -1)), want, rtol=1e-4, atol=1e-5)
    assert memory_slots_of(model.config, 1) == (3 if kw else 0)


def test_the_recall_memory_is_refused():
    model = tiny_model(memory_slots=3, memory_policy="recall")
    with pytest.raises(ValueError, match="recall"):
        layer_cache(model.blocks[0].attn, torch.randn(T, model.config.d_model), memory_slots=3)


def test_cache_files_are_whole_and_a_rerun_writes_only_the_missing(tmp_path: Path):
    model, plan = tiny_model(), tiny_plan()
    assert make_cache(model, tmp_path, plan, seqs=4) == 6
    assert make_cache(model, tmp_path, plan, seqs=4) == 0
    (tmp_path / "train" / "000002.safetensors").unlink()
    (tmp_path / "train" / "000004.tmp").write_bytes(b"half a file")  # a killed run's leftover: ignored
    assert make_cache(model, tmp_path, plan, seqs=5) == 2  # the missing one and the new one
    got = load_file(str(tmp_path / "train" / "000002.safetensors"))
    assert sorted(got) == sorted(["ids"] + [f"{k}.{i}" for k in "hy" for i in range(2)])
    assert torch.equal(got["ids"], torch.tensor(mixes(plan)["train"].sequence(2)))
    assert read_manifest(tmp_path, model, plan)["seqs"] == {"train": 5, "heldout": 2}


def test_a_cache_of_another_model_or_length_is_refused(tmp_path: Path):
    model, plan = tiny_model(), tiny_plan()
    make_cache(model, tmp_path, plan, seqs=1, heldout=1)
    with pytest.raises(ValueError, match="length 32"):
        read_manifest(tmp_path, model, tiny_plan(seq_len=40))
    other = build_model(window_config(vocab_size=272), seed=1)
    with pytest.raises(ValueError, match="another teacher"):
        read_manifest(tmp_path, other, plan)
    with pytest.raises(ValueError, match="another model"):
        make_cache(other, tmp_path, plan, seqs=1, heldout=1)
    trained = tiny_model()  # the same teacher with another branch: the same cache
    with torch.no_grad():
        trained.blocks[0].attn.gla_branch.log_beta.fill_(1.0)
    assert read_manifest(tmp_path, trained, plan)["seqs"] == {"train": 1, "heldout": 1}


@pytest.mark.parametrize("kw", [dict(), MEMORY], ids=["no-memory", "novelty-memory"])
def test_training_lowers_each_layers_held_out_error(tmp_path: Path, kw):
    plan = tiny_plan(windows={str(kw.get("window", 7)): 0.5, "4": 0.5}, seq_len=48)
    model = tiny_model(**kw)
    make_cache(model, tmp_path / "cache", plan)
    meta = train(model, tmp_path / "cache", plan, tmp_path / "run", [1, 0], log=lambda s: None)
    assert meta["layers_done"] == [1, 0] and meta["step"] == 2 * 3 * 6 and meta["current"] is None
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    done = [r for r in log if r.get("done")]
    assert [r["layer"] for r in done] == [1, 0]
    for r in done:
        assert r["kept"] and r["held_rel_mse_after"] < 0.9 * r["held_rel_mse_before"], r
        assert r["tokens_per_s_full_model"] == pytest.approx(r["token_layers_per_s"] / 2, rel=0.01)
    assert {r["window"] for r in log if "window" in r} == {int(w) for w in plan.windows}


def test_a_run_stopped_midway_and_resumed_is_bit_identical(tmp_path: Path):
    plan = tiny_plan()
    make_cache(tiny_model(), tmp_path / "cache", plan)
    one = tiny_model()
    train(one, tmp_path / "cache", plan, tmp_path / "one", [0, 1], log=lambda s: None)
    two = tiny_model()
    meta = train(two, tmp_path / "cache", plan, tmp_path / "two", [0, 1], until=5, log=lambda s: None)  # mid-layer 0
    assert meta["current"]["step"] == 5 and meta["layers_done"] == []
    for until in (25, None):  # a new process each time: fresh model, optimizer, window parts; then mid-layer 1
        fresh = tiny_model()
        meta = train(fresh, tmp_path / "cache", plan, tmp_path / "two", [0, 1], until=until, log=lambda s: None)
    assert meta["layers_done"] == [0, 1]
    a, b = branch_tensors(one), load_file(str(tmp_path / "two" / "branch.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a) and all(torch.equal(a[k], v) for k, v in branch_tensors(fresh).items())
    assert not torch.equal(a["blocks.1.attn.gla_branch.q_map"], branch_tensors(tiny_model())["blocks.1.attn.gla_branch.q_map"])


def test_a_run_refuses_another_plan_or_cache(tmp_path: Path):
    plan = tiny_plan()
    make_cache(tiny_model(), tmp_path / "cache", plan)
    train(tiny_model(), tmp_path / "cache", plan, tmp_path / "run", [0], until=2, log=lambda s: None)
    with pytest.raises(ValueError, match="another plan"):
        train(tiny_model(), tmp_path / "cache", tiny_plan(lr=0.5), tmp_path / "run", [0], log=lambda s: None)
    make_cache(tiny_model(), tmp_path / "cache", plan, seqs=7)  # the cache grew: not the run's any more
    with pytest.raises(ValueError, match="another cache"):
        train(tiny_model(), tmp_path / "cache", plan, tmp_path / "run", [0], log=lambda s: None)


def test_a_layer_no_better_than_its_init_is_put_back(tmp_path: Path):
    plan = tiny_plan(lr=1e3, mix_lr=1e3, clip=1e9, epochs=1)  # a step far too large: worse on held-out text
    make_cache(tiny_model(), tmp_path / "cache", plan)
    model = tiny_model()
    train(model, tmp_path / "cache", plan, tmp_path / "run", [0], log=lambda s: None)
    done = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines() if '"done"' in x]
    assert done[0]["kept"] is False
    init = branch_tensors(tiny_model())
    assert all(torch.equal(v, init[k]) for k, v in branch_tensors(model).items())


def test_export_reads_the_run_and_windows_follow_the_shares(tmp_path: Path):
    from recipes.smollm2_hybrid.train.export import branch_of_run

    plan = tiny_plan()
    make_cache(tiny_model(), tmp_path / "cache", plan)
    model = tiny_model()
    train(model, tmp_path / "cache", plan, tmp_path / "run", [1], log=lambda s: None)
    tensors, info = branch_of_run(tmp_path / "run")
    assert tensors.keys() == branch_tensors(model).keys() and info["step"] == "18"
    assert all(torch.equal(v, branch_tensors(model)[k]) for k, v in tensors.items())
    draws = [window_of(tiny_plan(windows={"256": 0.6, "64": 0.4}), 3, j) for j in range(2000)]
    assert draws == [window_of(tiny_plan(windows={"256": 0.6, "64": 0.4}), 3, j) for j in range(2000)]
    assert draws.count(64) / 2000 == pytest.approx(0.4, abs=0.04)
    assert parse_layers("0-2,5", 30) == [0, 1, 2, 5]


def test_the_command_line_caches_and_trains_from_a_model_dir(tmp_path: Path, monkeypatch):
    from agent.runtime.checkpoint import LoadedModel, save_model_dir
    from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
    from recipes.smollm2_hybrid.train import layerwise

    tok = byte_level_tokenizer()
    tok.hf.add_special_tokens(["<|endoftext|>"])
    save_model_dir(LoadedModel(tiny_model(), tok, ChatTemplate(), name="w"), tmp_path / "m", card={"name": "w"})
    (tmp_path / "corpus").mkdir()
    for split in ("train", "heldout"):
        (tmp_path / "corpus" / f"{split}.jsonl").write_text("".join(json.dumps({"source": d.source, "text": d.text}) + "\n" for d in docs()))
    common = ["--model", str(tmp_path / "m"), "--plan", str(write_plan(tmp_path / "plan.json", tiny_plan())), "--threads", "1"]
    monkeypatch.setattr(sys, "argv", ["layerwise", "cache", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "c"),
                                      "--seqs", "2", "--heldout-seqs", "1", *common])
    layerwise.main()
    monkeypatch.setattr(sys, "argv", ["layerwise", "train", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "r"),
                                      "--layers", "1", *common])
    layerwise.main()
    meta = json.loads((tmp_path / "r" / "branch.json").read_text())
    assert meta["layers_done"] == [1] and meta["step"] == 6 and (tmp_path / "r" / "pid").exists()
    monkeypatch.setattr(sys, "argv", ["layerwise", "train", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "r2"),
                                      *common[:2], "--plan", str(write_plan(tmp_path / "p40.json", tiny_plan(seq_len=40)))])
    with pytest.raises(SystemExit, match="length 32"):
        layerwise.main()

