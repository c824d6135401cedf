"""The arithmetic and the verdicts of `laplace bench llamacpp`, apart from anything that runs.

Inputs are `Measurement`s per subject (one per round); outputs are JSON-able: medians per
subject, per-round and median ratios per pair (laplace / llama.cpp for speeds, so above 1
means laplace is faster; laplace / llama.cpp for peak RSS, so below 1 means laplace is
leaner), the issue's floors for the matching pairs, and whether the machine was quiet
enough for any ratio to mean something.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent.bench.llamacpp_measure import Measurement

MAX_LOAD = 0.5  # 1-min load average before the run, with nothing of ours running
MAX_OTHERS = 0.10  # share of the machine's CPU that other processes may take during any child
FLOORS = {"decode": 1.0, "prefill": 1.0, "peak_rss": 1.2}  # issue 35: decode, prefill >= 1.0x; RSS <= 1.2x


@dataclass(frozen=True)
class Subject:
    """One runtime on one model in one format: a column of the alternation."""

    model: str  # "default", "mamba2-130m"
    runtime: str  # "laplace" | "laplace native" (the torch-free engine) | "llama.cpp"
    weights: str  # fp32 | bf16 | int8 | F32 | Q8_0 | Q4_1

    @property
    def key(self) -> str:
        return f"{self.model}/{self.runtime}/{self.weights}"


@dataclass(frozen=True)
class Pair:
    laplace: Subject
    llama: Subject
    matching: bool  # held to the floors (fp32 vs F32, int8 vs Q8_0); the Q4_1 pair is reported only

    @property
    def name(self) -> str:
        engine = "" if self.laplace.runtime == "laplace" else f"{self.laplace.runtime.removeprefix('laplace ')} "
        return f"{self.laplace.model}: {engine}{self.laplace.weights} vs {self.llama.weights}"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ratios(numer: Sequence[float], denom: Sequence[float]) -> list[float]:
    """Per-round ratios numer[i] / denom[i] (rounds paired as they ran)."""
    if len(numer) != len(denom) or not numer:
        raise ValueError("ratios need the same, nonzero number of rounds on both sides")
    return [n / d for n, d in zip(numer, denom)]


def summarize(runs: Sequence[Measurement]) -> dict[str, Any]:
    """Medians over the rounds, and the rounds themselves."""
    return {
        "prefill_tok_s": round(median([m.prefill_tok_s for m in runs]), 1),
        "decode_tok_s": round(median([m.decode_tok_s for m in runs]), 1),
        "peak_rss_MB": round(median([m.peak_rss_MB for m in runs]), 1),
        "rounds": [m.to_json() for m in runs],
    }


def pair_ratios(lap: Sequence[Measurement], cpp: Sequence[Measurement]) -> dict[str, dict[str, Any]]:
    """{"prefill" | "decode" | "peak_rss": {"median": x, "rounds": [...]}}, laplace / llama.cpp."""
    fields = {"prefill": "prefill_tok_s", "decode": "decode_tok_s", "peak_rss": "peak_rss_MB"}
    out = {}
    for name, field in fields.items():
        rs = ratios([getattr(m, field) for m in lap], [getattr(m, field) for m in cpp])
        out[name] = {"median": round(median(rs), 3), "rounds": [round(r, 3) for r in rs]}
    return out


def floors_met(r: Mapping[str, Mapping[str, float]]) -> dict[str, bool]:
    return {"decode": r["decode"]["median"] >= FLOORS["decode"], "prefill": r["prefill"]["median"] >= FLOORS["prefill"],
            "peak_rss": r["peak_rss"]["median"] <= FLOORS["peak_rss"]}


def load_verdict(load_before: float, load_after: float, others: Sequence[float], *, max_load: float = MAX_LOAD,
                 max_others: float = MAX_OTHERS) -> dict[str, Any]:
    """Whether ratios from this run mean anything. The load before must be low (nothing of
    ours ran yet); the load after includes this run's own threads, so it is reported, and the
    share of CPU other processes took during each child is what judges the run itself."""
    reasons = []
    if load_before > max_load:
        reasons.append(f"1-min load average {load_before:.2f} before the run, over {max_load:g}")
    busiest = max(others, default=0.0)
    if busiest > max_others:
        reasons.append(f"other processes took {busiest:.0%} of the CPU during a run, over {max_others:.0%}")
    return {"valid": not reasons, "reasons": reasons, "load_before": round(load_before, 2),
            "load_after": round(load_after, 2), "others_cpu_share_max": round(busiest, 3),
            "max_load": max_load, "max_others": max_others}


def subject_row(s: Subject, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Display strings (the table would print 72759.4 as 7.276e+04); the numbers are in "subjects"."""
    cells = {k: f"{summary[k]:,.1f}" for k in ("prefill_tok_s", "decode_tok_s", "peak_rss_MB")}
    return {"model": s.model, "runtime": s.runtime, "weights": s.weights, **cells, "note": ""}


def ratio_cell(r: Mapping[str, Any]) -> str:
    return f"{r['median']:.2f}x ({' '.join(f'{x:.2f}' for x in r['rounds'])})"


def ratio_row(p: Pair, r: Mapping[str, Mapping[str, Any]], valid: bool) -> dict[str, Any]:
    note = "NOT VALID: measured under load" if not valid else ""
    if valid and p.matching:
        met = floors_met(r)
        note = "floors met" if all(met.values()) else "below floor: " + ", ".join(k for k, ok in met.items() if not ok)
    return {"model": p.laplace.model, "runtime": f"{p.laplace.runtime} / llama.cpp", "weights": f"{p.laplace.weights} / {p.llama.weights}",
            "prefill_tok_s": ratio_cell(r["prefill"]), "decode_tok_s": ratio_cell(r["decode"]),
            "peak_rss_MB": ratio_cell(r["peak_rss"]), "note": note}


def report(subjects: Sequence[Subject], pairs: Sequence[Pair], runs: Mapping[str, Sequence[Measurement]],
           verdict: Mapping[str, Any]) -> dict[str, Any]:
    """Rows for the table (subjects, then one ratio row per pair) and the JSON behind them."""
    summaries = {s.key: summarize(runs[s.key]) for s in subjects}
    rows = [subject_row(s, summaries[s.key]) for s in subjects]
    pair_out = {}
    for p in pairs:
        r = pair_ratios(runs[p.laplace.key], runs[p.llama.key])
        rows.append(ratio_row(p, r, verdict["valid"]))
        pair_out[p.name] = {"laplace": p.laplace.key, "llama_cpp": p.llama.key, "ratios": r, "matching": p.matching,
                            "floors_met": floors_met(r) if p.matching else None}
    return {"rows": rows, "subjects": summaries, "pairs": pair_out, "ratios_valid": bool(verdict["valid"]),
            "load": dict(verdict)}


def load_line(verdict: Mapping[str, Any]) -> str:
    head = (f"1-min load {verdict['load_before']:.2f} before, {verdict['load_after']:.2f} after (includes this run); "
            f"others took at most {verdict['others_cpu_share_max']:.0%} of the CPU during a run")
    if verdict["valid"]:
        return head + ": quiet, ratios valid"
    return head + ": RATIOS NOT VALID (" + "; ".join(verdict["reasons"]) + "); run again alone"
