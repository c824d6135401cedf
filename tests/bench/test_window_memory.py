"""`laplace bench window-memory`: its arithmetic on made-up runs, its one-line refusals, and
the --quick form end to end (real children) on a tiny random window model directory, on the
torch runtime and on the torch-free engine."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.bench import window_memory as wm
from agent.bench.llamacpp import under_load
from agent.cli import app
from agent.bench.llamacpp_measure import MeasureError
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from tests.runtime.test_native_engine import kernels  # noqa: F401  (the fixture: the C kernels in a temporary cache)
from tests.runtime.test_window import window_model


def model_dir(root, **kw):
    """A tiny random window model (W 16, S 2) in int8 on its card, as the default model is."""
    model = window_model(seed=0, mix=0.5, vocab_size=264, window=16, sinks=2, **kw)
    return save_model_dir(LoadedModel(model, byte_level_tokenizer(), ChatTemplate(), name="tw"), root,
                          card={"name": "tw", "dtype": "int8"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("wm") / "tw")


def run(decode: float, prefill: float, state: int) -> dict:
    return {"decode_tok_s": decode, "prefill_tok_s": prefill, "state_bytes": state, "memory_bytes": 0,
            "memory_filled": 1.0, "peak_rss_MB": 300.0, "weights": "int8", "threads": 2}


def test_the_choices_parse_and_the_variants_start_with_the_window():
    assert wm.parse_slots(None) == (64, 128) and wm.parse_policies(None) == ("recall", "attention", "novelty")
    assert wm.parse_slots("128, 64,128") == (128, 64) and wm.parse_policies("attention") == ("attention",)
    assert [v.name for v in wm.variants((64,), ("recall", "attention"))] == ["window", "recall-64", "attention-64"]
    for bad in ("0", "64,-1", "x", ","):
        with pytest.raises(ValueError, match="--memory-slots"):
            wm.parse_slots(bad)
    with pytest.raises(ValueError, match="--policy takes one or more of recall, attention, novelty"):
        wm.parse_policies("recall,lru")


def test_ratios_are_time_per_token_and_the_decode_floor_needs_a_quiet_machine(tiny):
    p = wm.plan(str(tiny), None, (64, 128), ("attention",), quick=False)
    assert p.sizes == wm.Sizes(2048, 512, 128, wm.ROUNDS)
    runs = {"window": run(100.0, 1000.0, 20 * wm.MB), "attention-64": run(90.0, 800.0, 30 * wm.MB),
            "attention-128": run(50.0, 500.0, 33 * wm.MB)}
    quiet = {"valid": True, "reasons": [], "load_before": 0.1, "load_after": 1.9, "others_cpu_share_max": 0.0,
             "max_load": 0.5, "max_others": 0.1}
    res = wm.report(p, "tw", runs, quiet, quick=False)
    v = res["variants"]
    assert v["window"]["decode_time_ratio"] == 1.0 and v["window"]["floors_met"] is True
    assert v["attention-64"]["decode_time_ratio"] == pytest.approx(1.111, abs=1e-3)
    assert v["attention-64"]["prefill_time_ratio"] == 1.25 and v["attention-64"]["floors_met"] is True
    assert v["attention-128"]["floors"] == {"decode_time": False, "state": False}
    assert [r["note"] for r in res["rows"]] == ["floors met", "floors met", "below floor: decode over 1.2x, state over 32 MB"]
    assert res["summary"]["floors"] == "met by attention-64" and res["ratios_valid"] is True
    busy = {**quiet, "valid": False, "reasons": ["1-min load average 2.00 before the run, over 0.5"], "load_before": 2.0}
    res = wm.report(p, "tw", runs, busy, quick=False)
    assert res["ratios_valid"] is False and res["variants"]["attention-64"]["floors_met"] is None
    assert res["variants"]["attention-128"]["floors"] == {"decode_time": None, "state": False}  # arithmetic: judged anyway
    assert res["rows"][2]["note"] == "NOT VALID: measured under load; state over 32 MB"
    assert under_load({"results": {"decode": {}, "window-memory": res}}) == ["window-memory"]


def test_rounds_are_interleaved_and_the_ratio_is_the_median_of_paired_rounds(tiny, monkeypatch):
    """The memory costs 1.1x, and the machine runs at half speed through children 2-6 of 10
    (say another job ran then). Three of the memory's five rounds and two of the window's
    fell in it: the medians of their tok/s would put the ratio at 2.2, the paired rounds at 1.1."""
    p = wm.plan(str(tiny), None, (4,), ("novelty",), quick=False)
    assert p.sizes.rounds == wm.ROUNDS == 5
    order: list[str] = []

    def fake(plan, v, threads):
        slow = 2.0 if 1 <= len(order) <= 5 else 1.0
        order.append(v.name)
        t = (1.0 if v.name == "window" else 1.1) * slow  # seconds for the round's 128 tokens
        return {**run(128 / t, 512 / t, 20 * wm.MB), "decode_s": [t], "prefill_s": [t / 4], "others_cpu_share": 0.0,
                "peak_rss_MB": 300.0 + len(order)}

    monkeypatch.setattr(wm, "run_variant", fake)
    monkeypatch.setattr(wm, "settle", lambda *a: 0.0)
    res = wm.bench_window_memory(False, model=str(tiny), slots=(4,), policies=("novelty",), log=lambda s: None)
    assert order == ["window", "novelty-4", "novelty-4", "window"] * 2 + ["window", "novelty-4"]
    v = res["variants"]
    assert v["novelty-4"]["decode_s"] == pytest.approx([2.2, 2.2, 2.2, 1.1, 1.1])
    assert v["window"]["decode_s"] == pytest.approx([1.0, 2.0, 2.0, 1.0, 1.0])
    assert v["window"]["decode_tok_s"] / v["novelty-4"]["decode_tok_s"] == pytest.approx(2.2)  # unpaired: the drift
    assert v["novelty-4"]["decode_time_ratio"] == pytest.approx(1.1) and v["novelty-4"]["prefill_time_ratio"] == pytest.approx(1.1)
    assert v["window"]["peak_rss_MB"] == 309.0 and v["novelty-4"]["peak_rss_MB"] == 310.0
    assert "5 interleaved rounds" in res["summary"]["sizes"]


def test_quick_runs_every_variant_end_to_end_and_writes_the_ratios(tiny, tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(app, ["bench", "window-memory", "-m", str(tiny), "--quick", "--memory-slots", "4",
                                 "--out", str(out)])
    res = json.loads(out.read_text())["results"]["window-memory"]
    assert r.exit_code == (0 if res["ratios_valid"] else 3), r.output  # a busy machine: numbers kept, exit 3
    v = res["variants"]
    assert list(v) == ["window", "recall-4", "attention-4", "novelty-4"]
    assert res["sizes"] == {"context": 2 + 16 + 4 + wm.QUICK_PAST_FULL, "prefill": 64, "decode": 8, "rounds": 1}
    for name, x in v.items():
        assert x["prefill_tok_s"] > 0 and x["decode_tok_s"] > 0 and x["peak_rss_MB"] > 0 and x["weights"] == "int8"
        assert x["decode_time_ratio"] > 0 and x["prefill_time_ratio"] > 0 and x["floors"]["state"] is True
    assert v["window"]["decode_time_ratio"] == 1.0 and v["window"]["memory_bytes"] == 0
    # 2 layers x 2 kv heads x 4 slots x (key and value of 8 floats, a float score, an int64 position)
    assert v["recall-4"]["memory_bytes"] == v["novelty-4"]["memory_bytes"] == 2 * 2 * 4 * (2 * 8 * 2 + 4 + 8)  # keys and values bf16
    assert v["recall-4"]["state_bytes"] == v["window"]["state_bytes"] + v["recall-4"]["memory_bytes"]
    assert v["recall-4"]["memory_filled"] == v["attention-4"]["memory_filled"] == v["novelty-4"]["memory_filled"] == 1.0
    assert "window-memory" in r.output and "ratios_valid" in r.output
    # the default runtime: torch, since the engine runs the novelty memory only
    assert res["runtime"] == "torch" and "not recall, attention" in res["runtime_why"]
    assert {x["runtime"] for x in v.values()} == {"torch"}


def test_the_engine_runs_the_novelty_variants_without_torch(kernels, tmp_path):  # noqa: F811
    """--runtime engine end to end: each child on the torch-free engine (int8, from the cache an
    int8 torch load writes, as chat's first start does), never importing torch, its memory full
    after the context; and the engine is the default where it runs every variant."""
    d = model_dir(tmp_path / "tw")
    load_model_dir(d, quant="int8")
    assert wm.plan(str(d), None, (4,), ("novelty",), quick=True).runtime == "engine"
    out = tmp_path / "b.json"
    r = CliRunner().invoke(app, ["bench", "window-memory", "-m", str(d), "--quick", "--memory-slots", "4", "--policy",
                                 "novelty", "--runtime", "engine", "--out", str(out)])
    res = json.loads(out.read_text())["results"]["window-memory"]
    assert r.exit_code == (0 if res["ratios_valid"] else 3), r.output
    assert res["runtime"] == "engine" and res["runtime_why"] == "--runtime engine"
    v = res["variants"]
    assert list(v) == ["window", "novelty-4"]
    for x in v.values():
        assert x["runtime"] == "engine" and x["weights"] == "int8" and x["torch_imported"] is False
        assert x["prefill_tok_s"] > 0 and x["decode_tok_s"] > 0 and x["decode_time_ratio"] > 0
    assert v["window"]["memory_filled"] is None and v["novelty-4"]["memory_filled"] == 1.0
    assert v["novelty-4"]["memory_bytes"] == 2 * 2 * 4 * (2 * 8 * 2 + 4 + 8)  # keys and values bf16
    assert v["novelty-4"]["state_bytes"] == v["window"]["state_bytes"] + v["novelty-4"]["memory_bytes"]


def test_without_the_int8_cache_the_engine_child_says_so_and_the_default_is_torch(kernels, tmp_path):  # noqa: F811
    d = model_dir(tmp_path / "tw")  # saved, never loaded: no int8 cache yet
    p = wm.plan(str(d), None, (4,), ("novelty",), quick=True)
    assert p.runtime == "torch" and "no int8 cache" in p.runtime_why
    p = wm.plan(str(d), None, (4,), ("novelty",), quick=True, runtime="engine")
    with pytest.raises(MeasureError) as e:
        wm.run_variant(p, wm.WINDOW, 1)
    last = str(e.value).splitlines()[-1]
    assert last.startswith("the torch-free engine cannot run") and "one int8 load with the torch runtime writes it" in last


@pytest.mark.parametrize("args, message", [
    (["--memory-slots=-4"], "--memory-slots takes memory sizes of 1 or more"),
    (["--policy", "lru"], "--policy takes one or more of recall, attention, novelty"),
    (["--policy", "recall"], "has no GLA branch, and the recall policy scores tokens by its recall error: use --policy attention,novelty"),
    (["--context", "20", "--policy", "attention"], "--context 20 leaves the memory part empty"),
    (["-m", "demo"], "has the gla mixer; this bench measures the window mixer's memory"),
    (["--runtime", "gpu"], "--runtime takes torch or engine, got 'gpu'"),
    (["--runtime", "engine", "--policy", "attention,novelty"],
     "--runtime engine: the torch-free engine keeps a memory by the novelty policy only, not attention; "
     "--runtime torch runs it"),
], ids=["negative-M", "unknown-policy", "recall-without-branch", "short-context", "not-a-window-model", "unknown-runtime",
        "policy-the-engine-refuses"])
def test_bad_input_is_a_one_line_error_before_any_child(args, message, tmp_path, monkeypatch):
    monkeypatch.setattr(wm, "run_variant", lambda *a: pytest.fail("no child runs for a bad command"))
    plain = model_dir(tmp_path / "plain", gla_branch=False)
    args = args if "-m" in args else ["-m", str(plain), *args]
    r = CliRunner().invoke(app, ["bench", "window-memory", "--quick", "--out", str(tmp_path / "b.json"), *args])
    assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.output


@pytest.mark.parametrize("flag", [["--memory-slots", "64"], ["--runtime", "engine"]], ids=["memory-slots", "runtime"])
def test_its_flags_belong_to_it(flag):
    r = CliRunner().invoke(app, ["bench", "decode", *flag])
    assert r.exit_code == 1 and "apply to the window-memory benchmark only" in r.stderr
