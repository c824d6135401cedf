"""`laplace bench llamacpp`: the plan, the rounds, the ratios and the load verdict on fake
measurements; the CLI's argument errors and its exit code under load; nothing here builds
llama.cpp or times anything (tests/bench/test_llamacpp_build.py holds the build's tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.bench import llamacpp as lc
from agent.bench import llamacpp_cli
from agent.bench.llamacpp_build import BuildError, LlamaCpp
from agent.bench.llamacpp_measure import Measurement, Protocol
from agent.bench.llamacpp_report import Subject, load_verdict, pair_ratios, report
from agent.cli import app


def test_plan_pairs_the_matching_formats_and_the_default_dtype_with_q4_1():
    subjects, pairs = lc.plan("int8", "mamba2-130m")
    assert [s.key for s in subjects[:8]] == [
        "default/laplace/fp32", "default/laplace native/fp32", "default/llama.cpp/F32", "default/laplace/int8",
        "default/laplace native/int8", "default/llama.cpp/Q8_0", "default/laplace/bf16", "default/llama.cpp/Q4_1"]
    assert [(p.name, p.matching) for p in pairs] == [
        ("default: fp32 vs F32", True), ("default: int8 vs Q8_0", True), ("default: native fp32 vs F32", True),
        ("default: native int8 vs Q8_0", True), ("default: int8 vs Q4_1", False),
        ("mamba2-130m: fp32 vs F32", True), ("mamba2-130m: int8 vs Q8_0", True)]
    assert len(lc.plan("fp32", None)[0]) == 8  # no Mamba-2 rows
    assert lc.laplace_dtype("float32") == "fp32" and lc.laplace_dtype("bfloat16") == "bf16"
    with pytest.raises(ValueError, match="LAPLACE_DTYPE='float16'"):
        lc.laplace_dtype("float16")


def test_rounds_alternate_every_subject_once_per_round():
    subjects, _ = lc.plan("fp32", None)
    order: list[str] = []

    def measure(s: Subject, path: Path) -> Measurement:
        order.append(s.key)
        assert path == Path(s.key)
        return Measurement(1.0, 1.0, 1.0)

    runs = lc.run_rounds(subjects, {s.key: Path(s.key) for s in subjects}, 3, measure, log=lambda line: None)
    assert order == [s.key for s in subjects] * 3
    assert all(len(v) == 3 for v in runs.values())


def _m(prefill: float, decode: float, rss: float, others: float = 0.0) -> Measurement:
    return Measurement(prefill, decode, rss, others)


def test_ratios_are_per_round_then_median_laplace_over_llama_cpp():
    lap = [_m(400, 13, 950), _m(410, 12, 940), _m(420, 14, 960)]
    cpp = [_m(800, 65, 580), _m(820, 60, 590), _m(840, 70, 600)]
    r = pair_ratios(lap, cpp)
    assert r["decode"]["rounds"] == [0.2, 0.2, 0.2] and r["decode"]["median"] == 0.2
    assert r["prefill"]["median"] == 0.5
    assert r["peak_rss"]["rounds"] == [pytest.approx(1.638, abs=1e-3), pytest.approx(1.593, abs=1e-3), 1.6]
    with pytest.raises(ValueError):
        pair_ratios(lap, cpp[:2])


def _fake_runs(subjects, others: float = 0.0) -> dict[str, list[Measurement]]:
    """laplace at half llama.cpp's speed and 1.5x its memory, except int8: faster and leaner."""
    runs = {}
    for s in subjects:
        base = [_m(100 + i, 50 + i, 500, others) for i in range(3)]
        if s.runtime == "laplace":
            f, mem = (1.5, 0.9) if s.weights == "int8" else (0.5, 1.5)
            base = [_m(m.prefill_tok_s * f, m.decode_tok_s * f, m.peak_rss_MB * mem, others) for m in base]
        runs[s.key] = base
    return runs


def test_report_rows_medians_ratios_and_floors():
    subjects, pairs = lc.plan("fp32", None)
    verdict = load_verdict(0.1, 1.9, [0.01, 0.02])
    out = report(subjects, pairs, _fake_runs(subjects), verdict)
    assert out["ratios_valid"] is True
    rows = {(r["runtime"], r["weights"]): r for r in out["rows"]}
    assert out["subjects"]["default/llama.cpp/F32"]["decode_tok_s"] == 51.0
    assert out["subjects"]["default/laplace/fp32"]["decode_tok_s"] == 25.5
    assert rows[("llama.cpp", "F32")]["decode_tok_s"] == "51.0" and rows[("laplace", "fp32")]["peak_rss_MB"] == "750.0"
    assert rows[("laplace / llama.cpp", "fp32 / F32")]["decode_tok_s"].startswith("0.50x (")
    assert rows[("laplace / llama.cpp", "fp32 / F32")]["note"] == "below floor: decode, prefill, peak_rss"
    assert rows[("laplace / llama.cpp", "int8 / Q8_0")]["note"] == "floors met"
    assert rows[("laplace / llama.cpp", "fp32 / Q4_1")]["note"] == ""  # reported, not held to a floor
    assert out["pairs"]["default: int8 vs Q8_0"]["floors_met"] == {"decode": True, "prefill": True, "peak_rss": True}
    assert out["pairs"]["default: fp32 vs Q4_1"]["floors_met"] is None
    json.dumps(out)  # all of it goes into the JSON file


@pytest.mark.parametrize("before, others, valid, reason", [
    (0.2, [0.0, 0.05], True, None),
    (0.8, [0.0], False, "1-min load average 0.80 before the run, over 0.5"),
    (0.1, [0.0, 0.3], False, "other processes took 30% of the CPU during a run, over 10%"),
], ids=["quiet", "loaded-before", "busy-during"])
def test_load_verdict(before, others, valid, reason):
    v = load_verdict(before, 2.0, others)
    assert v["valid"] is valid
    assert v["reasons"] == ([] if reason is None else [reason])
    assert v["load_after"] == 2.0  # reported; it includes the run's own threads, so it judges nothing


def test_ratios_measured_under_load_are_marked_not_valid():
    subjects, pairs = lc.plan("fp32", None)
    out = report(subjects, pairs, _fake_runs(subjects), load_verdict(1.5, 2.0, [0.0]))
    assert out["ratios_valid"] is False and out["load"]["reasons"]
    ratio_rows = [r for r in out["rows"] if r["runtime"] == "laplace / llama.cpp"]
    assert len(ratio_rows) == 3 and all(r["note"] == "NOT VALID: measured under load" for r in ratio_rows)
    native_rows = [r for r in out["rows"] if r["runtime"] == "laplace native / llama.cpp"]
    assert len(native_rows) == 2 and all(r["note"] == "NOT VALID: measured under load" for r in native_rows)
    assert ratio_rows[0]["decode_tok_s"].startswith("0.50x")  # the numbers are still printed


def test_settle_waits_for_the_load_to_fall_but_not_forever():
    loads = iter([2.0, 1.2, 0.6, 0.4])
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    got = lc.settle(0.5, 60, log=lambda line: None, clock=lambda: now[0], sleep=sleep, loadavg=lambda: (next(loads), 0, 0))
    assert got == 0.4 and now[0] == 15.0
    got = lc.settle(0.5, 10, log=lambda line: None, clock=lambda: now[0], sleep=sleep, loadavg=lambda: (3.0, 0, 0))
    assert got == 3.0  # gave up after 10 s: the verdict will say so


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """bench_llamacpp with no build, download or child: fake tools, files and measurements."""
    loads = {"value": 0.1}
    others = {"value": 0.0}
    monkeypatch.setattr(lc, "prepare_tools", lambda home, d, jobs, log: LlamaCpp(tmp_path / "tools"))
    monkeypatch.setattr(lc, "default_model_ggufs", lambda tools, home, url=None: {
        t: tmp_path / f"m.{t}.gguf" for t in ("Q4_1", "F32", "Q8_0")})
    monkeypatch.setattr(lc, "prepare_mamba", lambda tools, home, shape, log: (None, {}, "left out in tests"))
    monkeypatch.setattr(lc.os, "getloadavg", lambda: (loads["value"], 0.0, 0.0))
    monkeypatch.setattr(lc, "settle", lambda max_load, wait_s, log: loads["value"])  # no waiting in tests

    def measure_subject(tools, protocol):
        def measure(s, path):
            f = 0.5 if s.runtime == "laplace" else 1.0
            return Measurement(100 * f, 50 * f, 500 / f, others["value"])
        return measure

    monkeypatch.setattr(lc, "measure_subject", measure_subject)
    monkeypatch.setattr(lc, "default_model_dir", lambda settings: tmp_path / "default")
    monkeypatch.setattr("agent.cli.models.ensure_model", lambda settings, spec: None)
    return {"load": loads, "others": others}


def test_bench_end_to_end_on_fakes(fake_bench, tmp_path):
    res = lc.bench_llamacpp(False, home=tmp_path, model_dir=tmp_path / "default", settle_s=0, log=lambda line: None)
    assert res["ratios_valid"] is True and res["rounds"] == 3
    assert res["protocol"] == {"threads": 2, "prompt": 512, "gen": 128, "depth": 512, "seed": 0}
    assert res["summary"]["protocol"].startswith("llama-bench -t 2 -p 512 -n 128 -d 512")
    assert "Mamba-2 rows skipped: left out in tests" in res["summary"]["mamba2"]
    assert res["pairs"]["default: fp32 vs F32"]["ratios"]["decode"]["median"] == 0.5


def test_cli_writes_json_and_exits_3_under_load(fake_bench, tmp_path):
    out = tmp_path / "b.json"
    fake_bench["load"]["value"] = 1.7
    r = CliRunner().invoke(app, ["bench", "llamacpp", "-m", "default", "--out", str(out)])
    assert r.exit_code == 3, r.output
    assert "no ratio is valid" in r.output and "NOT VALID" in r.output
    res = json.loads(out.read_text())["results"]["llamacpp"]
    assert res["ratios_valid"] is False and res["load"]["load_before"] == 1.7
    assert res["subjects"]["default/laplace/fp32"]["decode_tok_s"] == 25.0  # the numbers are kept
    fake_bench["load"]["value"] = 0.1
    r = CliRunner().invoke(app, ["bench", "llamacpp", "--out", str(out)])  # -m default is implied
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["results"]["llamacpp"]["ratios_valid"] is True


def test_cli_under_load_from_others_during_the_run(fake_bench, tmp_path):
    fake_bench["others"]["value"] = 0.4
    assert llamacpp_cli.main(["--out", str(tmp_path / "b.json"), "--settle", "0"]) == lc.EXIT_UNDER_LOAD


@pytest.mark.parametrize("args, message", [
    (["bench", "llamacpp", "-m", "demo"], "-m demo has no such GGUF: laplace bench llamacpp -m default"),
    (["bench", "llamacpp", "--shape", "tiny,warp=9"], "bad shape override"),
    (["bench", "llamacpp", "--shape", "mamba3"], "unknown shape"),
    (["bench", "decode", "--shape", "tiny"], "--shape applies to the llamacpp benchmark only"),
    (["bench", "decode", "-m", "default"], "-m applies to the cpu1b, dtype, window-memory, serve and llamacpp benchmarks only"),
], ids=["other-model", "bad-override", "unknown-shape", "shape-elsewhere", "m-elsewhere"])
def test_cli_argument_errors(args, message, monkeypatch):
    monkeypatch.setattr("agent.cli.models.ensure_model", lambda *a: pytest.fail("no model is built for a bad command"))
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and message in r.output


def test_cli_refuses_a_dtype_it_cannot_pair(monkeypatch):
    monkeypatch.setenv("LAPLACE_DTYPE", "float16")
    monkeypatch.setattr("agent.cli.models.ensure_model", lambda *a: pytest.fail("no model is built for a bad command"))
    r = CliRunner().invoke(app, ["bench", "llamacpp"])
    assert r.exit_code == 1 and "LAPLACE_DTYPE='float16' is not one the bench can pair" in r.output


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["-p", "0"], None), (["-d", "-1"], "depth must be 0 or more"), (["-t", "0"], "threads must be at least 1"),
    (["--jobs", "0"], "--jobs must be at least 1"), (["--shape", "tiny,layers=x"], "bad shape override"),
], ids=["rounds", "prompt-zero-is-default", "depth", "threads", "jobs", "shape"])
def test_knobs_are_checked(argv, message):
    a = llamacpp_cli.parser().parse_args(argv)
    if message is None:
        assert llamacpp_cli.options_from(a)["protocol"] == Protocol()
        return
    with pytest.raises(ValueError, match=message):
        llamacpp_cli.options_from(a)


def test_knob_errors_exit_2_before_any_work(capsys):
    assert llamacpp_cli.main(["--rounds", "0"]) == 2
    assert "error: --rounds must be at least 1" in capsys.readouterr().err


def test_the_default_model_must_be_built(tmp_path):
    from agent.settings import Settings

    with pytest.raises(BuildError, match="laplace bench llamacpp -m default"):
        lc.default_model_dir(Settings(home=tmp_path))


def test_a_missing_toolchain_is_one_line_with_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setattr("agent.bench.llamacpp_build.shutil.which", lambda name: None)
    monkeypatch.setattr(lc, "default_model_dir", lambda settings: tmp_path / "default")
    monkeypatch.setattr("agent.cli.models.ensure_model", lambda settings, spec: None)
    r = CliRunner().invoke(app, ["bench", "llamacpp"])
    assert r.exit_code == 1
    err = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "needs cmake and a C compiler" in err[0]
    assert "apt-get install cmake build-essential" in err[0] and "--llama-cpp DIR" in err[0]


def test_a_failed_child_is_an_error_line_not_a_traceback(fake_bench, monkeypatch, tmp_path):
    from agent.bench.llamacpp_measure import MeasureError

    def measure_subject(tools, protocol):
        def measure(s, path):
            raise MeasureError("llama-bench on m.Q8_0.gguf failed (exit -11):\nno output")
        return measure

    monkeypatch.setattr(lc, "measure_subject", measure_subject)
    r = CliRunner().invoke(app, ["bench", "llamacpp", "--out", str(tmp_path / "b.json")])
    assert r.exit_code == 1 and "error: llama-bench on m.Q8_0.gguf failed (exit -11)" in r.output
    assert "Traceback" not in r.output


def test_the_q4_1_pair_takes_the_dtype_chat_runs_the_default_in(tmp_path, monkeypatch):
    """The card's dtype (int8 for a default built now), unless LAPLACE_DTYPE is set."""
    from types import SimpleNamespace

    model = tmp_path / "models" / "default"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"card": {"dtype": "int8"}}))
    seen = {}
    monkeypatch.setattr(lc, "bench_llamacpp", lambda quick, **kw: seen.update(kw) or {})
    monkeypatch.setattr(lc, "default_model_dir", lambda settings: model)
    base = dict(home=tmp_path, models_dir=tmp_path / "models", default_model_url=None)
    lc.bench_for_settings(SimpleNamespace(dtype="float32", dtype_set=False, **base), True)
    assert seen["default_dtype"] == "int8"
    lc.bench_for_settings(SimpleNamespace(dtype="bfloat16", dtype_set=True, **base), True)
    assert seen["default_dtype"] == "bf16"
