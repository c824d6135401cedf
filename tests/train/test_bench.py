"""`run_train_bench`: the fast parts by default, the whole quick run when slow tests run."""

from __future__ import annotations

import json

import pytest

from agent.bench.train import run_train_bench, traffic


def test_traffic_factors_are_json_and_grow_with_ranks() -> None:
    t = json.loads(json.dumps(traffic()))
    f = {w: t["laplace-3b"][w]["saving_factor"] for w in ("2", "4", "8", "64")}
    assert f["2"] < f["4"] < f["8"] < f["64"]
    # every rank gathering every 3B matrix at 64 ranks: the published ~10.87 GB per rank
    assert 10.0e9 < t["laplace-3b"]["64"]["all_gather_bytes_per_rank_max"] < 11.5e9


@pytest.mark.slow
def test_quick_bench_runs_and_is_json() -> None:
    r = json.loads(json.dumps(run_train_bench(quick=True)))
    assert r["throughput"][0]["muon"]["tokens_per_s"] > 0
    d = r["domain_finetune"]
    assert d["domain_eval_after_tune_all"] < d["domain_eval_before"]
