"""Probe reports: the versioned JSON, the terminal table, and baseline comparison.

The JSON holds no wall-clock measurement, so the same model, suite and seed give
byte-identical files (timings are printed, not stored). `compare` flags only regressions
that the data supports: a cell whose new interval lies wholly below the baseline's, a D50
drop of more than 20%, or any resume or self-test failure.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch

from agent.runtime.checkpoint import LoadedModel

from agent.recall.decays import round6
from agent.probes.runner import Outcome
from agent.probes.stats import chance_corrected, decay_distances, mean_ci, sparkline, wilson

SCHEMA = "laplace-probe-report"
SCHEMA_VERSION = 1
D50_DROP = 0.2
# Recall needs both: accuracy above chance and the state lifting the answer over a blank
# state. With 20 rows of 8 trials, accuracy alone is "above chance" somewhere by luck.
MIN_LIFT_NATS = 0.1


class ReportError(ValueError):
    """A file is not a probe report this version can read."""


def _cell(probe: str, filler: str, d: int, results: list, kinds: list[str] | None = None,
          blocks: list[tuple[bool, int]] | None = None) -> dict[str, Any]:
    n = len(results)
    top1 = sum(a.top1 for a, _ in results)
    chance = sum(1 / a.n_candidates for a, _ in results) / n
    lo, hi = wilson(top1, n)
    lift, llo, lhi = mean_ci([a.lift for a, _ in results])
    cell: dict[str, Any] = {
        "probe": probe, "filler": filler, "distance": d, "n": n,
        "chance": round6(chance), "top1": round6(top1 / n), "ci": [round6(lo), round6(hi)],
        "cc": round6(chance_corrected(top1 / n, chance)),
        "mrr": round6(sum(1 / a.rank for a, _ in results) / n),
        "exact": round6(sum(a.exact for a, _ in results) / n),
        "contains": round6(sum(a.contains for a, _ in results) / n),
        "lift": round6(lift), "lift_ci": [round6(llo), round6(lhi)],
        "blank_top1": round6(sum(a.blank_rank == 1 for a, _ in results) / n),
    }
    if kinds and len(kinds) == n and len(set(kinds)) > 1:
        # Greedy exact recall per value kind ("digits" is the 5-digit number).
        cell["exact_by_kind"] = {k: round6(sum(a.exact for (a, _), kk in zip(results, kinds) if kk == k) / kinds.count(k))
                                 for k in sorted(set(kinds))}
    if blocks:  # a recall-refresh cell: how often the block repeated the fact, and its size
        cell["refresh"] = {"recalled": round6(sum(h for h, _ in blocks) / len(blocks)),
                           "blocks": round6(sum(t > 0 for _, t in blocks) / len(blocks)),
                           "mean_tokens": round6(sum(t for _, t in blocks) / len(blocks)),
                           "max_tokens": max(t for _, t in blocks)}
    if any(s is not None for _, s in results):
        stale = sum(bool(s) for _, s in results) / n
        cell["stale"] = round6(stale)
        cell["other"] = round6(1 - top1 / n - stale)
    return cell


def _summary(probe: str, filler: str, cells: list[dict], ledger: dict | None, passkey: dict[int, float]) -> dict[str, Any]:
    ds = [c["distance"] for c in cells]
    cc = [c["cc"] for c in cells]
    first = cells[0] if cells and cells[0]["distance"] == 0 else None
    competent = bool(first and first["ci"][0] > first["chance"] and first["lift_ci"][0] > MIN_LIFT_NATS)
    dd = decay_distances(ds, cc, competent)
    out: dict[str, Any] = {
        "probe": probe, "filler": filler, "distances": ds, "top1": [c["top1"] for c in cells], "cc": cc,
        "competent": competent, **dd,
        "spark": sparkline([max(0.0, min(1.0, c["top1"])) for c in cells]),
        "ledger_d50": ledger["predicted_d50"] if ledger else None,
    }
    if first is not None:
        out["at_chance"] = first["ci"][0] <= first["chance"] <= first["ci"][1]
        out["lift_at_0"] = first["lift"]
        out["lift_ci_at_0"] = first["lift_ci"]
    if probe == "order" and passkey:
        out["gap_vs_passkey"] = {str(c["distance"]): round6(c["top1"] - passkey[c["distance"]]) for c in cells if c["distance"] in passkey}
    return out


def build_report(outcome: Outcome, loaded: LoadedModel, *, device: str = "cpu") -> dict[str, Any]:
    s = outcome.suite
    cells, summaries = [], []
    rows: dict[tuple[str, str], list[dict]] = {}
    for f in s.fillers:
        for p in s.probes:
            for d in sorted(set(s.distances)):
                res = outcome.answers.get((p, f, d))
                if res:
                    c = _cell(p, f, d, res, outcome.kinds.get((p, f, d)), outcome.blocks.get((p, f, d)))
                    cells.append(c)
                    rows.setdefault((p, f), []).append(c)
    for (p, f), rc in rows.items():
        pk = {c["distance"]: c["top1"] for c in rows.get(("passkey", f), [])}
        summaries.append(_summary(p, f, rc, outcome.ledgers.get(f), pk))
    dtype = str(next(loaded.model.parameters()).dtype).replace("torch.", "")
    plan = outcome.plan
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "suite": {"name": s.name, "probes": list(s.probes), "fillers": list(s.fillers), "distances": sorted(set(s.distances)),
                  "trials": s.trials, "seed": outcome.seed, "style": outcome.style,
                  "budget_s": plan.budget_s if plan else None, "n_candidates": s.candidates,
                  **({"refresh": outcome.refresh} if outcome.refresh else {})},
        "model": {"name": loaded.name, "fingerprint": loaded.fingerprint, "config": loaded.config.to_dict(),
                  "card": loaded.card, "trained": loaded.card.get("trained", True)},
        "runtime": {"torch": torch.__version__, "python": platform.python_version(), "device": device, "dtype": dtype,
                    "decoding": "greedy", "state_dtype": "float32"},
        "cells": cells,
        "summaries": summaries,
        "state_metrics": {"state_bytes": loaded.config.state_bytes(), "ledger": outcome.ledgers,
                          "trace": outcome.trace, "resume": outcome.resume},
        "skipped": outcome.skipped,
        "notes": _notes(summaries, outcome),
    }


def _notes(summaries: list[dict], outcome: Outcome) -> list[str]:
    notes = []
    zero = [s for s in summaries if "lift_at_0" in s]
    if zero and not any(s["competent"] for s in zero):
        lifts = [s["lift_at_0"] for s in zero]
        chance = sum(s["at_chance"] for s in zero)
        mean_lift = sum(lifts) / len(lifts)
        # A large lift with chance-level picks means the state holds the fact but this prompt
        # style does not get it out (e.g. completion prompts on a chat-only model).
        why = ("an untrained model scores like this" if mean_lift < 0.1 else
               "yet the state does lift the answer: try the other --style (chat models need --style chat)")
        notes.append(
            f"no recall: no row beats chance at distance 0 with the state lifting the answer over a blank state "
            f"({chance} of {len(zero)} rows sit within chance's interval; mean lift {mean_lift:+.3f} nats); {why}")
    t = outcome.trace
    if t is not None:
        st = t["self_test"]
        if st["passed"] is None:
            notes.append("self-test not run: no layer-0 head carried a difference to follow at these distances "
                         "(a window model's GLA state takes the planted value only once it has left the window)")
        else:
            notes.append(f"self-test {'passed' if st['passed'] else 'FAILED'}: layer-0 state difference followed the decays "
                         f"on {st['checked']} head checks (worst relative error {st['worst_rel_error']:.2g})")
    if outcome.resume is not None:
        r = outcome.resume
        notes.append(f"resume check {'passed' if r['passed'] else 'FAILED'}: saved+loaded state gives "
                     f"{'identical' if r['passed'] else 'different'} next-token logits (max diff {r['max_abs_diff']:.3g})")
    return notes


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load_report(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReportError(f"{path} is not a laplace probe report")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ReportError(f"{path} has report schema version {data.get('schema_version')}; this laplace reads {SCHEMA_VERSION}")
    return data


def _effective_d50(s: dict) -> float | None:
    if not s.get("competent"):
        return None
    if s.get("d50") is not None:
        return float(s["d50"])
    return float(max(s["distances"])) if s.get("d50_censored") else None


def compare(base: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], int]:
    """(regressions, cells compared). A regression is a cell whose new 95% interval lies
    wholly below the baseline's, a D50 drop over 20%, or a failed resume or self-test."""
    regressions: list[str] = []
    old_cells = {(c["probe"], c["filler"], c["distance"]): c for c in base["cells"]}
    compared = 0
    for c in new["cells"]:
        b = old_cells.get((c["probe"], c["filler"], c["distance"]))
        if b is None:
            continue
        compared += 1
        if c["ci"][1] < b["ci"][0]:
            regressions.append(f"cell {c['probe']}/{c['filler']}/d={c['distance']}: top-1 {b['top1']:.2f} -> {c['top1']:.2f} "
                               f"(new interval {c['ci'][0]:.2f}-{c['ci'][1]:.2f} below baseline's {b['ci'][0]:.2f}-{b['ci'][1]:.2f})")
    old_rows = {(s["probe"], s["filler"]): s for s in base["summaries"]}
    for s in new["summaries"]:
        b = old_rows.get((s["probe"], s["filler"]))
        if b is None:
            continue
        bd, nd = _effective_d50(b), _effective_d50(s)
        if bd is not None and (nd is None or nd < (1 - D50_DROP) * bd):
            regressions.append(f"D50 {s['probe']}/{s['filler']}: {bd:.0f} -> {'none' if nd is None else f'{nd:.0f}'} tokens (over {D50_DROP:.0%} drop)")
    sm = new.get("state_metrics", {})
    if sm.get("resume") and not sm["resume"].get("passed"):
        regressions.append("resume check failed: saved and loaded state gives different logits")
    if sm.get("trace") and sm["trace"]["self_test"].get("passed") is False:  # None: nothing to check, not a failure
        regressions.append("counterfactual self-test failed: layer-0 state difference does not follow the decays")
    return regressions, compared
