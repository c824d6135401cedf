"""Suites and the budget planner.

A suite is a grid: probes x fillers x distances x trials. With a budget, a short warm-up
measures this model's speed on this machine and the planner shrinks the grid until its
estimate fits: first fewer trials (down to a floor), then the largest distances, then the
last probes and fillers. Everything it drops is listed with the reason. At run time a
deadline, checked before every question and every filler segment, stops what would still
overrun, so a run ends within its budget plus about one question. The warm-up (one row:
a filler stretch and one question at chance, the dearest kind) counts against the budget
too, and the deadline cuts it as well.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

SUITE_NAMES = ("smoke", "quick", "standard", "full", "refresh")
MIN_TRIALS = 4
PLAN_SAFETY = 0.85  # plan to 85% of what is left: estimates from one warm-up are rough
REFRESH_MODES = ("off", "on", "both")  # recall refresh measured: without, with, or both side by side
N_CANDIDATES = 20  # the forced choice's size unless a suite says otherwise


@dataclass(frozen=True)
class Suite:
    name: str
    probes: tuple[str, ...]
    fillers: tuple[str, ...]
    distances: tuple[int, ...]
    trials: int
    # Seconds a run may take unless the user says otherwise (None: the whole grid, always).
    # smoke is a fixed grid so CI output is identical run to run.
    default_budget_s: float | None = None
    # Recall refresh measured by default (off | on | both); `--refresh` overrides it.
    refresh: str = "off"
    # Values in each forced choice (the answer and distractors of its token length). A
    # question asked at chance reads nearly all of them, one state copy each.
    candidates: int = N_CANDIDATES


def _pow2(top: int) -> tuple[int, ...]:
    out, d = [0], 64
    while d <= top:
        out.append(d)
        d *= 2
    return tuple(out)


SUITES: dict[str, Suite] = {
    # smoke: every probe kind, inside the default model's 256-token window and past it, on
    # one filler, in a 10-way choice: about a minute on the default model. Its cost is the
    # questions asked at chance (past the window, and every blank control), each reading
    # nearly every candidate on its own copy of a 21 MB state.
    "smoke": Suite("smoke", ("passkey", "multikey-4", "update", "order"), ("grammar",), (0, 64, 256), 4, candidates=10),
    "quick": Suite("quick", ("passkey", "multikey-4", "multikey-16", "update", "order"), ("noise", "grammar", "chat", "logs"),
                   _pow2(1024), 8, default_budget_s=45.0),
    "standard": Suite("standard", ("passkey", "multikey-4", "multikey-16", "multikey-64", "update", "order"),
                      ("noise", "grammar", "chat", "logs"), _pow2(8192), 16, default_budget_s=600.0),
    "full": Suite("full", ("passkey", "multikey-4", "multikey-16", "multikey-64", "update", "order"),
                  ("noise", "grammar", "chat", "logs"), _pow2(65536), 32),
    # Recall refresh on vs off, side by side, on chat filler (distance 0 is the competence check).
    "refresh": Suite("refresh", ("passkey", "multikey-4", "update"), ("chat",), (0, 256, 512, 1024, 2048, 4096, 8192), 32,
                     refresh="both"),
}


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITE_NAMES)}") from None


@dataclass(frozen=True)
class Speed:
    """Measured by the warm-up on `rows` batch rows at once (a sweep batches its trials):
    seconds per filler token position and per question asked, for all rows together."""

    s_per_token: float
    s_per_ask: float  # without the blank control (a sweep asks it once per group)
    warmup_s: float
    rows: int = 1
    s_per_blank: float = 0.0


@dataclass
class Plan:
    suite: Suite
    budget_s: float | None
    estimated_s: float | None = None
    skipped: list[dict] = field(default_factory=list)


PLANT_TOKENS = 80  # a typical prefix + plant + question length, for estimates only


def estimate(suite: Suite, speed: Speed) -> float:
    """Seconds for the sweep plus the state metrics (ledger, trace, resume).

    One group per (probe, filler) reads plant + filler once with all trials as rows and asks
    at every distance. Cost is taken as linear in the rows (pessimistic for small models,
    whose cost is mostly per call)."""
    top = max(suite.distances)
    scale = max(suite.trials, 1) / speed.rows
    per_group = ((PLANT_TOKENS + top) * speed.s_per_token + len(suite.distances) * speed.s_per_ask + speed.s_per_blank) * scale
    groups = len(suite.probes) * len(suite.fillers)
    trace = ((PLANT_TOKENS + top) * speed.s_per_token + len(suite.distances) * speed.s_per_ask) * max(1.0, 2 / speed.rows)
    return groups * per_group + trace + speed.s_per_ask / speed.rows


def plan_suite(suite: Suite, budget_s: float | None, speed: Speed | None, spent_s: float | None = None) -> Plan:
    """Shrink `suite` until its estimate fits what is left of the budget: after `spent_s`
    seconds already gone (model load, warm-up; default the warm-up's own time)."""
    if budget_s is None or speed is None:
        return Plan(suite, budget_s)
    spent = speed.warmup_s if spent_s is None else spent_s
    avail = max(0.0, (budget_s - spent) * PLAN_SAFETY)
    skipped: list[dict] = []
    s = suite
    while estimate(s, speed) > avail:
        if s.trials > MIN_TRIALS:
            new = max(MIN_TRIALS, s.trials // 2)
            skipped.append({"probe": "*", "filler": "*", "distance": "*", "what": f"trials {new + 1}..{s.trials}",
                            "reason": "budget: fewer trials per cell"})
            s = replace(s, trials=new)
        elif len(s.distances) > 2:
            skipped.append({"probe": "*", "filler": "*", "distance": s.distances[-1], "what": "distance",
                            "reason": "budget: largest distance dropped"})
            s = replace(s, distances=s.distances[:-1])
        elif len(s.probes) > 1:
            skipped.append({"probe": s.probes[-1], "filler": "*", "distance": "*", "what": "probe",
                            "reason": "budget: probe dropped"})
            s = replace(s, probes=s.probes[:-1])
        elif len(s.fillers) > 1:
            skipped.append({"probe": "*", "filler": s.fillers[-1], "distance": "*", "what": "filler",
                            "reason": "budget: filler dropped"})
            s = replace(s, fillers=s.fillers[:-1])
        else:
            skipped.append({"probe": "*", "filler": "*", "distance": "*", "what": "minimum grid",
                            "reason": "budget: even the smallest grid is estimated over budget; the deadline cuts it"})
            break
    return Plan(s, budget_s, round(estimate(s, speed), 3), skipped)


class Deadline:
    """Wall-clock limit checked between questions; `None` budget never expires."""

    def __init__(self, budget_s: float | None, start: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.at = None if budget_s is None else start + budget_s
        self.clock = clock

    def passed(self) -> bool:
        return self.at is not None and self.clock() >= self.at
