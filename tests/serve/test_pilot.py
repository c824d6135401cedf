"""`laplace bench serve`, shrunk: a real server process, a bounded load, the whole report."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.bench.serve import PilotConfig, run_pilot
from agent.cli import app


def test_the_pilot_writes_its_report_and_compiles_nothing_after_warm_up(tmp_path):
    cfg = PilotConfig.quick(rates=(6.0,), duration_s=2.0, baseline_requests=2, probes=1, widths=(1, 2, 4),
                            max_requests_per_phase=16, phase_deadline_s=60.0, replay_sessions=2, users=(1, 4))
    result = run_pilot(cfg, tmp_path / "report")
    names = {p.name for p in (tmp_path / "report").iterdir()}
    assert names == {"report.md", "report.json", "latency.png", "throughput.png", "widths.png"}
    assert all((tmp_path / "report" / n).read_bytes().startswith(b"\x89PNG") for n in names if n.endswith(".png"))
    s = result["summary"]
    assert s["compiles_after_warmup"] == 0 and s["compiles_at_warmup"] >= 3  # every width, then the prefill buckets
    assert [r["phase"] for r in result["rows"]] == ["one at a time", "poisson 6/s", "1 user back to back",
                                                    "4 users back to back"]
    assert [(m["from_users"], m["to_users"]) for m in s["one_more_user"]] == [(1, 4)]
    assert result["limits"]["max_prompt_tokens"] == 8192 and result["limits"]["max_queue"] == 1000
    report = (tmp_path / "report" / "report.md").read_text()
    assert "What one more user costs" in report and "max_queue 1,000 (laplace serve's default: 64)" in report
    assert all(r["errors"] == 0 and r["ok"] == r["requests"] > 0 for r in result["rows"])
    assert set(result["server"]["width_histogram"]) <= {"1", "2", "4"}
    assert result["numerics"]["max_abs_logit_diff"] < 1e-3 and result["recall"]["probes"] == 1
    assert json.loads((tmp_path / "report" / "report.json").read_text())["summary"] == s
    assert "compiles after warm-up | **0**" in (tmp_path / "report" / "report.md").read_text()


def test_bench_serve_flags_are_checked():
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "serve", "--rates", "0,2"])
    assert res.exit_code == 1 and "positive requests per second" in res.output
    res = runner.invoke(app, ["bench", "decode", "--duration", "3"])
    assert res.exit_code == 1 and "serve benchmark only" in res.output
    res = runner.invoke(app, ["bench", "serve", "--users", "0,4"])
    assert res.exit_code == 1 and "positive user counts" in res.output
    res = runner.invoke(app, ["bench", "serve", "--compile-backend", "tvm"])
    assert res.exit_code == 1 and "eager, inductor or none" in res.output
