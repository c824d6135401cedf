"""The terminal rendering of a probe report: a table of cells and the state metrics."""

from __future__ import annotations

from typing import Any


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x < 1e6 else f"{x:.2g}"


def render(report: dict[str, Any]) -> str:
    """Rows probe x filler, columns distance: top-1 % [95% interval]; then D50, H90, the
    ledger's prediction and a sparkline; then state metrics, notes and skipped cells."""
    s = report["suite"]
    ds: list[int] = s["distances"]
    cells = {(c["probe"], c["filler"], c["distance"]): c for c in report["cells"]}
    label_w = max([len(f"{p} / {f}") for p in s["probes"] for f in s["fillers"]] + [14])
    col_w = 11
    head = f"{'probe / filler':<{label_w}}  " + "".join(f"{('d=' + str(d)) if d == 0 else str(d):>{col_w}}" for d in ds)
    head += f"  {'D50':>6} {'H90':>6} {'ledger':>7}  curve"
    chance = report["cells"][0]["chance"] if report["cells"] else 0.05
    m = report["model"]
    lines = [
        f"laplace probe: suite {s['name']}, model {m['name']} ({m['fingerprint'][:12]}), {s['style']} prompts, "
        f"{s['trials']} trials per cell, seed {s['seed']}",
        f"forced choice among {s['n_candidates']}: top-1 % [95% interval]; chance {_pct(chance)}%; distance = tokens since the fact",
        "",
        head,
        "-" * len(head),
    ]
    summaries = {(r["probe"], r["filler"]): r for r in report["summaries"]}
    for f in s["fillers"]:
        for p in s["probes"]:
            row = f"{p + ' / ' + f:<{label_w}}  "
            for d in ds:
                c = cells.get((p, f, d))
                txt = "skip" if c is None else f"{_pct(c['top1'])} [{_pct(c['ci'][0])},{_pct(c['ci'][1])}]"
                row += f"{txt:>{col_w}}"
            r = summaries.get((p, f))
            if r is not None:
                d50 = ("≥" + _num(max(r["distances"]))) if r.get("d50_censored") else _num(r.get("d50"))
                row += f"  {d50:>6} {_num(r.get('h90')):>6} {_num(r.get('ledger_d50')):>7}  {r['spark']}"
            lines.append(row)
    for f in s["fillers"]:
        upd = [cells.get(("update", f, d)) for d in ds]
        if any(c is not None and "stale" in c for c in upd):
            lines.append(f"update / {f}: stale value picked " + " ".join(
                "-" if c is None else f"{_pct(c['stale'])}%" for c in upd) + " (by distance)")
        r = summaries.get(("order", f))
        if r is not None and r.get("gap_vs_passkey"):
            lines.append(f"order  / {f}: question-first minus question-last top-1 " + " ".join(
                f"{100 * r['gap_vs_passkey'][str(d)]:+.0f}" if str(d) in r["gap_vs_passkey"] else "-" for d in ds) + " points")
    lines += _refresh_lines(report, cells, ds)
    lines.append("")
    lines.append("D50: distance where accuracy above chance halves ('-': no recall at distance 0); H90: last distance holding 90% of it; "
                 "ledger: slowest head's measured half-life on that filler (the state's own prediction of D50)")
    sm = report["state_metrics"]
    for fname, led in sorted((sm.get("ledger") or {}).items()):
        sl = led["slowest"]
        lines.append(f"ledger {fname:<10} slowest head L{sl['layer']}.H{sl['head']} half-life {_num(sl['half_life'])} tokens, "
                     f"horizon {_num(led['horizon'])} tokens (0.1% left)")
    tr = sm.get("trace")
    if tr:
        gaps = ", ".join(f"{r['distance']}:{r['logp_gap']:+.2f}" for r in tr["rows"])
        lines.append(f"trace  answer log-prob gap (planted vs counterfactual value) by distance: {gaps}")
    lines.extend(f"note   {n}" for n in report.get("notes", []))
    skipped = report.get("skipped") or []
    if skipped:
        lines.append(f"skipped ({len(skipped)}):")
        for sk in skipped[:20]:
            lines.append(f"  {sk['probe']}/{sk['filler']}/d={sk['distance']}: {sk['what']} - {sk['reason']}")
        if len(skipped) > 20:
            lines.append(f"  ... and {len(skipped) - 20} more (see the JSON)")
    return "\n".join(lines)


def _refresh_lines(report: dict[str, Any], cells: dict, ds: list[int]) -> list[str]:
    """For each PROBE+refresh row beside its PROBE row: greedy exact recall off -> on by
    distance, and how often the recall block repeated the planted fact."""
    r = report["suite"].get("refresh")
    if not r:
        return []
    out = [f"refresh: block of at most {r['tokens']} tokens, turns older than {r['horizon']} tokens ({r['horizon_source']}); "
           "exact = greedy answer right, off -> on; recalled = block repeated the fact"]
    for f in report["suite"]["fillers"]:
        for p in report["suite"]["probes"]:
            if not p.endswith("+refresh"):
                continue
            base = p[: -len("+refresh")]
            parts = []
            for d in ds:
                on, off = cells.get((p, f, d)), cells.get((base, f, d))
                if on is None:
                    continue
                was = "-" if off is None else _pct(off["exact"])
                parts.append(f"{d}: {was}->{_pct(on['exact'])}% ({_pct(on['refresh']['recalled'])}%)")
            out.append(f"  {base} / {f}: " + "  ".join(parts))
    return out
