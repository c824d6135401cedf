"""recipes/smollm2_hybrid/measure/memory: the variants share the weights, full attention is
the teacher, the tasks are what they claim, and the table and horizon read the reports
right. On a tiny random window model with a byte-level tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from agent.probes.natural_text import mentions
from agent.recall.horizon import horizon_from_card
from agent.runtime.checkpoint import LoadedModel, save_model_dir
from agent.runtime.layers import rope
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from recipes.smollm2_hybrid.measure import memory
from recipes.smollm2_hybrid.measure.memory import (FULL, WINDOW, MeasureError, Variant, answer_tasks, detail_tasks, has_code,
                                                   passkey_tasks, run_detail, run_passkey, run_ppl, variant_config,
                                                   variant_model, variants)
from recipes.smollm2_hybrid.measure.memory_report import detail_horizon, render_table
from recipes.smollm2_hybrid.measure.perplexity import token_losses
from tests.runtime.test_window import window_model

QUIET = lambda _m: None  # noqa: E731
HAS_MEMORY = "memory_slots" in {f.name for f in dataclasses.fields(memory.LaplaceConfig)}


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    """Window 16 + 2 sinks, the GLA branch on and far from its init (it changes the logits)."""
    model = window_model(seed=0, mix=0.5, vocab_size=264, window=16, sinks=2)
    return LoadedModel(model, byte_level_tokenizer(), ChatTemplate(), name="tiny-window")


@torch.no_grad()
def teacher_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Plain causal softmax attention over every key, true RoPE positions: the teacher."""
    x = model.embed(ids)
    B, T = ids.shape
    pos = torch.arange(T)
    for block in model.blocks:
        a = block.attn
        c = a.config
        q, k, v = a._qkv(block.attn_norm(x))
        R = c.n_heads // c.kv_heads
        q = rope(q.transpose(1, 2), pos, c.rope_theta)
        k = rope(k.transpose(1, 2), pos, c.rope_theta).repeat_interleave(R, 1)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2).repeat_interleave(R, 1), is_causal=True)
        x = x + a.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + block.ffn(block.ffn_norm(x))
    return model.head(x)


def test_full_attention_is_the_teacher_and_the_window_only_within_s_plus_w(lm):
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(1))
    teacher = F.cross_entropy(teacher_logits(lm.model, ids[None, :-1])[0], ids[1:], reduction="none")
    full = variant_model(lm, FULL, len(ids))
    assert full.config.window + full.config.sinks >= len(ids) and full.config.gla_branch
    assert full.model.embed.weight.data_ptr() == lm.model.embed.weight.data_ptr()  # shared, not copied
    got = torch.tensor(token_losses(full.model, ids, segment=8))  # in pieces, the state carried
    torch.testing.assert_close(got, teacher, rtol=1e-4, atol=1e-4)
    window = torch.tensor(token_losses(variant_model(lm, WINDOW, len(ids)).model, ids, segment=8))
    edge = lm.config.sinks + lm.config.window
    torch.testing.assert_close(window[:edge], teacher[:edge], rtol=1e-4, atol=1e-4)
    assert (window[edge:] - teacher[edge:]).abs().max() > 1e-2  # past S + W the window is not the teacher


def test_variants_and_their_configs(lm):
    vs = variants([128, 0, 64, 64], ["recall", "attention"])
    assert [v.name for v in vs] == ["full", "window", "recall-64", "recall-128", "attention-64", "attention-128"]
    assert variant_config(lm.config, FULL, 3000).window == 3008 and variant_config(lm.config, WINDOW, 3000) == lm.config
    assert variant_config(lm.config, FULL, 5).window == variant_config(lm.config, FULL, 18).window == 16  # never below W
    assert variant_config(lm.config, FULL, 19).window == 32
    mem = Variant("attention-4", 4, "attention")
    if HAS_MEMORY:
        c = variant_config(lm.config, mem, 100)
        assert (c.memory_slots, c.memory_policy, c.window) == (4, "attention", lm.config.window)
        # a model whose memory has two sizes: M is the variant's, the rest group kept; none in full or window
        two = lm.config.replace(memory_slots=8, memory_policy="novelty", memory_layers=(1,), memory_rest_slots=2)
        assert variant_config(two, Variant("novelty-4", 4, "novelty"), 100).memory_rest_slots == 2
        for v in (FULL, WINDOW):
            assert (variant_config(two, v, 100).memory_slots, variant_config(two, v, 100).memory_rest_slots) == (0, 0)
    else:
        with pytest.raises(MeasureError, match="memory_slots"):
            variant_config(lm.config, mem, 100)


def test_passkey_tasks_have_the_length_depth_and_code_asked(lm):
    tasks = passkey_tasks(lm, 300, 4, seed=3)
    assert tasks == passkey_tasks(lm, 300, 4, seed=3) and tasks != passkey_tasks(lm, 300, 4, seed=4)
    for t in tasks:
        assert len(t.context) + len(t.question) == 300
        assert len(t.answer) == 5 and t.answer.isdigit()
        said = lm.tokenizer.decode(t.context)
        assert said.count(t.answer) == 1 and t.answer not in lm.tokenizer.decode(t.question)
        at = len(lm.tokenizer.encode(said[: said.index(t.answer)]))  # bytes: tokens before the code
        assert 0.1 * 300 - 25 <= at <= 0.5 * 300 + 40  # the depth (back to a sentence's end), plus the statement's words
    with pytest.raises(MeasureError, match="too short"):
        passkey_tasks(lm, 150, 1, seed=0)


def test_scoring():
    assert has_code("The code is 12345.", "12345") and has_code("12345", "12345")
    assert not has_code("123456", "12345") and not has_code("912345", "12345") and not has_code("1234 5", "12345")
    assert mentions("Your sister is called Vera.", "Vera") and not mentions("Your sister is Olga.", "Vera")


def test_answers_are_the_greedy_continuation(lm):
    """A task whose question is a cue: the reply is the model's own greedy continuation, the
    same read in batches of one row or of all."""
    tasks = passkey_tasks(lm, 280, 3, seed=0)
    one = answer_tasks(lm, tasks, 6, state_bytes=1)
    assert one == answer_tasks(lm, tasks, 6, state_bytes=1 << 30) and len(one) == 3
    stops, out = lm.template.stop_ids(lm.tokenizer), []
    with torch.no_grad():
        for _ in range(6):  # one whole pass a token: the slow way
            nxt = int(lm.model(torch.tensor([tasks[0].context + tasks[0].question + out]))[0][0, -1].argmax())
            if nxt in stops:
                break
            out.append(nxt)
    assert one[0] == lm.tokenizer.decode(out)


def test_passkey_and_detail_reports(lm):
    vs = variants([0], ["recall"])
    rep = run_passkey(lm, vs, [360, 300], 2, seed=0, log=QUIET)
    json.dumps(rep)
    assert rep["measure"] == "passkey" and [r["length"] for r in rep["rows"]] == [300, 360]
    for r in rep["rows"]:
        assert set(r["variants"]) == {"full", "window"} and all(x["n"] == 2 and 0 <= x["hits"] <= 2 for x in r["variants"].values())
    det = run_detail(lm, vs, [2, 1.5], 2, seed=0, log=QUIET)
    assert [(r["distance"], r["multiple"]) for r in det["rows"]] == [(24, 1.5), (32, 2)]
    assert all(t.distance >= 24 for t in detail_tasks(lm, 24, 2, 0))
    assert set(det["horizon"]) == {"full", "window"}
    for r in det["rows"]:
        full = r["variants"]["full"]["score"]
        for x in r["variants"].values():
            assert x["ratio_to_full"] == (x["score"] / full if full else None)


def test_ppl_is_the_same_below_s_plus_w_and_cut_at_the_bands(lm):
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    rep = run_ppl(lm, variants([0], ["recall"]), [("doc", ids)], [40, 60, 100], segment=16, log=QUIET)
    json.dumps(rep)
    assert rep["settings"]["cuts"] == {"within": [0, 18], "past_40": [18, 39], "past_60": [18, 59]}
    rows = rep["rows"][0]["variants"]
    assert all(r["within_max_abs_diff"] < 1e-4 for r in rows.values())
    assert rows["window"]["within"] == pytest.approx(rows["full"]["within"], rel=1e-4)
    assert abs(rows["window"]["past_60"] - rows["full"]["past_60"]) > 1e-3


def test_horizon_is_the_largest_distance_still_at_0_9():
    assert detail_horizon([(384, 1.0), (512, 0.9), (1024, 0.5)]) == 512
    assert detail_horizon([(1024, 0.95), (384, 0.9), (512, 1.0)]) == 1024  # measured order does not matter
    assert detail_horizon([(384, 0.95), (512, 0.7), (1024, 0.95)]) == 384  # the first fall ends it
    assert detail_horizon([(384, 0.85), (512, 1.0)]) is None and detail_horizon([]) is None
    assert horizon_from_card({"recall_horizon": detail_horizon([(384, 1.0), (512, 0.9)])}) == 512  # as chat reads the card


def _rep(measure: str, rows: list, settings: dict, **extra) -> dict:
    names = {n for r in rows for n in r["variants"]}
    vs = [{"name": n, "memory_slots": int(n.split("-")[1]) if "-" in n else 0,
           "memory_policy": n.split("-")[0] if "-" in n else None} for n in sorted(names)]
    return {"measure": measure, "schema_version": 1, "model": {"name": "m", "fingerprint": "f" * 64, "window": 256, "sinks": 4},
            "variants": vs, "seed": 0, "settings": settings, "rows": rows, **extra}


def test_table_rows_columns_and_ratios():
    names = ["recall-128", "attention-64", "window", "full", "recall-64"]
    pk = _rep("passkey", [{"length": L, "variants": {n: {"n": 10, "hits": i + k, "score": (i + k) / 10} for i, n in enumerate(names)}}
                          for k, L in enumerate([2048, 1024])], {"trials": 10, "filler": "grammar"})
    score = {"full": 0.9, "window": 0.3, "recall-64": 0.45, "recall-128": 0.9, "attention-64": 0.0}
    ratios = {n: {"score": s, "ratio_to_full": s / 0.9} for n, s in score.items()}
    det = _rep("detail", [{"distance": 384, "multiple": 1.5, "variants": ratios}], {"trials": 16},
               horizon={"full": 384, "window": None, "recall-64": None, "recall-128": 384, "attention-64": None})
    losses = {n: {"within": 10.0, "past_2048": 20.0 + i, "within_max_abs_diff": 1e-6} for i, n in enumerate(names)}
    ppl = _rep("ppl", [{"variants": losses}], {"tokens": 2048, "docs": ["a"], "source": "x", "edge": 260,
                                               "cuts": {"within": [0, 260], "past_2048": [260, 2047]}})
    lines = render_table([pk, det, ppl]).splitlines()
    assert lines[0] == "| variant | M | passkey 1k | passkey 2k | detail 384 (1.5W) | ppl < S+W | ppl S+W..2048 | horizon |"
    body = lines[2:7]
    assert [row.split(" | ")[0] for row in body] == ["| full attention", "| window only", "| memory, attention",
                                                      "| memory, recall", "| memory, recall"]
    assert body[0] == "| full attention | - | 4/10 | 3/10 | 0.90 | 10.000 | 23.000 | 384 |"
    assert body[3] == "| memory, recall | 64 | 5/10 | 4/10 | 0.45 (0.50x) | 10.000 | 24.000 | - |"
    assert body[4].startswith("| memory, recall | 128 | 1/10 | 0/10 | 0.90 (1.00x) |")
    assert any("below S+W every variant's losses are full attention's to 1.0e-06" in x for x in lines)


def test_cli_end_to_end_and_table(lm, tmp_path, capsys):
    threads = torch.get_num_threads()
    save_model_dir(lm, tmp_path / "model")
    try:
        memory.main(["passkey", "--model", str(tmp_path / "model"), "--memory-slots", "0", "--lengths", "300",
                     "--trials", "1", "--threads", "1", "--out", str(tmp_path / "pk.json")])
        if not HAS_MEMORY:
            with pytest.raises(SystemExit, match="no memory_slots"):
                memory.main(["detail", "--model", str(tmp_path / "model"), "--memory-slots", "8", "--quick", "--threads", "1",
                             "--out", str(tmp_path / "d.json")])
    finally:
        torch.set_num_threads(threads)
    assert "passkey 300 tokens window: " in capsys.readouterr().out
    memory.main(["table", str(tmp_path / "pk.json")])
    out = capsys.readouterr().out
    assert out.startswith("| variant | M | passkey 300 |") and "| window only | - |" in out


def test_engine_runtime_answers_as_torch_does(lm, tmp_path, capsys):
    """`--runtime engine`: each trial on the torch-free engine, the same greedy replies as
    torch's rows for the window alone and for a novelty memory; other policies refused."""
    from agent.runtime.native import library

    if library() is None:
        pytest.skip("the C kernels do not build here")
    save_model_dir(lm, tmp_path / "model")
    from agent.runtime.checkpoint import load_model_dir

    saved = load_model_dir(tmp_path / "model")
    tasks = passkey_tasks(saved, 280, 3, seed=0)
    for v in (WINDOW, Variant("novelty-4", 4, "novelty")):
        torch_replies = answer_tasks(variant_model(saved, v, 300), tasks, 6, state_bytes=1 << 30)
        engine_replies = memory.engine_answers(saved, v, 300, tasks, 6, weights="fp32", threads=1)
        assert engine_replies == torch_replies, v.name
    with pytest.raises(SystemExit, match="novelty policy only, not attention-4"):
        memory.main(["passkey", "--model", str(tmp_path / "model"), "--memory-slots", "4", "--policy", "attention",
                     "--runtime", "engine", "--lengths", "280", "--trials", "1", "--threads", "1", "--out", str(tmp_path / "x.json")])
    memory.main(["passkey", "--model", str(tmp_path / "model"), "--memory-slots", "4", "--policy", "novelty", "--skip", "full",
                 "--runtime", "engine", "--lengths", "280", "--trials", "2", "--threads", "1", "--out", str(tmp_path / "e.json")])
    rep = json.loads((tmp_path / "e.json").read_text())
    assert rep["settings"]["runtime"] == "engine (fp32)"
    assert set(rep["rows"][0]["variants"]) == {"window", "novelty-4"}
