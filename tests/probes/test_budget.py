"""A budget is honoured on a model whose every row costs time (as on the 135 M default,
where a call's cost is mostly copying its rows' 21 MB states): the warm-up that plans the
run counts against the budget, and the deadline stops the sweep cleanly, keeping what was
measured and listing what was not."""

from __future__ import annotations

import time

from agent.probes.report import build_report
from agent.probes.runner import run_suite
from agent.probes.suites import SUITES
from agent.runtime.checkpoint import load_model

ROW_S = 0.003  # seconds per batch row of every call


def _slow_tiny():  # type: ignore[no-untyped-def]
    lm = load_model("tiny")
    m = lm.model
    forward, step_ = m.forward, m.step_

    def slow_forward(ids, state=None, **kw):  # type: ignore[no-untyped-def]
        time.sleep(ROW_S * ids.shape[0])
        return forward(ids, state, **kw)

    def slow_step(tokens, state):  # type: ignore[no-untyped-def]
        time.sleep(ROW_S * tokens.shape[0])
        return step_(tokens, state)

    m.forward, m.step_ = slow_forward, slow_step  # instance attributes: nn.Module calls them
    return lm


def test_a_budget_includes_the_warm_up_and_the_deadline_cuts_cleanly():
    lm = _slow_tiny()
    budget = 3.0
    t0 = time.perf_counter()
    out = run_suite(lm, SUITES["standard"], budget_s=budget)
    elapsed = time.perf_counter() - t0
    # Allowance: about one question on a group's rows (here well under a second).
    assert elapsed <= budget + 1.0, elapsed
    assert out.plan is not None and any(s["reason"].startswith("budget") for s in out.plan.skipped)
    r = build_report(out, lm)
    assert r["cells"], "what was measured before the deadline is reported"
    assert r["suite"]["budget_s"] == budget


def test_a_budget_spent_before_the_run_measures_nothing_and_says_so():
    lm = _slow_tiny()
    out = run_suite(lm, SUITES["quick"], budget_s=1.0, started=time.perf_counter() - 5.0)  # e.g. a slow model load
    r = build_report(out, lm)
    assert not r["cells"]
    assert r["skipped"] and all(s["reason"].startswith(("deadline", "budget")) for s in r["skipped"])
