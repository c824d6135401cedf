"""The 'no recall' note tells an untrained model from a prompt style that hides recall."""

from __future__ import annotations

from agent.probes.report import _notes
from agent.probes.runner import Outcome
from agent.probes.suites import SUITES


def _rows(lift: float) -> list[dict]:
    return [{"lift_at_0": lift, "competent": False, "at_chance": True} for _ in range(3)]


def test_no_lift_reads_as_untrained_and_big_lift_points_at_the_style():
    outcome = Outcome(suite=next(iter(SUITES.values())), seed=0, style="completion")
    [untrained] = _notes(_rows(0.01), outcome)
    assert "untrained model" in untrained
    [hidden] = _notes(_rows(1.2), outcome)
    assert "--style" in hidden and "untrained" not in hidden
