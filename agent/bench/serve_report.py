"""The serving pilot's report: report.md (tables), report.json (everything), three PNGs.

The PNGs are drawn with the probes' small rasterizer (agent/probes/plot.py), so no plotting
library is needed: latency percentiles by phase, throughput by phase against the
one-at-a-time baseline, and the decode batch-width histogram with the rows really used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.probes.plot import BLACK, GREY, PALETTE, Canvas

W, H, LEFT, TOP, BOTTOM = 900, 420, 70, 40, 70


def _ms(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v:,.1f}"


def markdown(result: dict[str, Any]) -> str:
    cfg, s = result["config"], result["summary"]
    lines = [
        "# laplace serve: serving pilot",
        "",
        f"Model `{cfg['model']}` ({cfg.get('dtype', 'float32')}), widths {cfg['widths']}, compile backend `{cfg['compile_backend']}`, "
        f"rates {list(cfg['rates'])} req/s for {cfg['duration_s']:g} s each, seed {cfg['seed']}. "
        f"Every request streams; latencies are what the client saw, in ms.",
        "",
        "| phase | requests | ok | tokens/s | gain | TTFT p50 / p95 / p99 | ITL p50 / p95 / p99 | TPOT p50 / p95 / p99 | "
        "queue p50 / p95 / p99 | steps | padding waste | continued |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        trio = ["{} / {} / {}".format(*(_ms(r, f"{k}_{q}_ms") for q in ("p50", "p95", "p99")))
                for k in ("ttft", "itl", "tpot", "queue")]
        lines.append(
            f"| {r['phase']} | {r['requests']} | {r['ok']} | {r['tokens_per_s']:,.1f} | {r['gain_vs_one_at_a_time'] or '-'}x | "
            f"{' | '.join(trio)} | {r['decode_steps']} | {r['padding_waste']:.1%} | {r['continued_sessions']} |")
    comp, num, rec, srv = result["compile"], result["numerics"], result["recall"], result["server"]
    more = s.get("one_more_user") or []
    if more:
        lines += ["", "What one more user costs (closed loops, per user added):", "",
                  "| users | ITL p50 ms / user | TTFT p50 ms / user | completion tokens/s / user |",
                  "| --- | ---: | ---: | ---: |"]
        lines += [f"| {m['from_users']} -> {m['to_users']} | {_num(m['itl_p50_ms_per_user'])} | "
                  f"{_num(m['ttft_p50_ms_per_user'])} | {_num(m['tokens_per_s_per_user'])} |" for m in more]
    lines += ["", limits_line(result.get("limits") or {}, s.get("refused") or {})]
    lines += [
        "",
        "| check | result |",
        "| --- | --- |",
        f"| compiles at warm-up | {s['compiles_at_warmup']} (warm-up {s['warmup_seconds']:.1f} s, "
        f"{comp['compile_seconds']:.1f} s of it in the `{comp['backend']}` backend) |",
        f"| compiles after warm-up | **{s['compiles_after_warmup']}** (must be 0) |",
        f"| batch sizes seen / widths compiled | {s['distinct_batch_sizes_seen']} / {len(cfg['widths'])} "
        "(unpadded, each size would be its own compile) |",
        f"| decode steps by width | {srv.get('width_histogram')} |",
        f"| padding waste, whole run | {srv.get('padding_waste', 0):.1%} of row-steps |",
        f"| server time, whole run | prefill {srv.get('prefill_seconds', 0):.1f} s ({srv.get('prefill_tokens', 0):,} tokens), "
        f"decode {srv.get('decode_seconds', 0):.1f} s ({srv.get('decode_steps', 0):,} steps, "
        f"{srv.get('completion_tokens', 0):,} tokens), of {srv.get('uptime_s', 0):.0f} s up |",
        f"| compiled vs eager, max abs logit diff | {_numerics(num)} |",
        f"| recall probes, under load / idle | {_acc(rec['accuracy_under_load'])} / {_acc(rec['accuracy_idle'])} "
        f"({rec['probes']} probes; identical greedy answers {rec['identical_answers']}) |",
        f"| server start-up (incl. compile) | {s['server_startup_s']} s |",
        f"| pilot wall time | {s['pilot_seconds']} s |",
        "",
        "![latency](latency.png) ![throughput](throughput.png) ![widths](widths.png)",
        "",
    ]
    return "\n".join(lines)


# `laplace serve`'s own defaults, so the report says where the pilot's server differs.
SERVE_DEFAULTS = {"max_queue": 64, "max_tokens": 4096, "max_prompt_tokens": 8192, "max_body_bytes": 1 << 20}


def limits_line(limits: dict[str, Any], refused: dict[str, int]) -> str:
    """The limits the measured server enforced (and where they differ from a plain
    `laplace serve`), and how many requests each phase had refused: numbers measured under
    a looser limit than an operator runs must say so."""
    if not limits:
        return "Limits: not reported by the server."
    parts = []
    for key, value in limits.items():
        default = SERVE_DEFAULTS.get(key)
        parts.append(f"{key} {value:,}" + (f" (laplace serve's default: {default:,})" if default not in (None, value) else ""))
    told = ", ".join(f"{phase}: {n}" for phase, n in refused.items()) or "none"
    return f"Limits of the measured server: {'; '.join(parts)}. Requests refused (4xx, 429) by phase: {told}."


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+,.2f}"


def _acc(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _numerics(num: dict[str, Any]) -> str:
    if "skipped" in num:
        return f"skipped: {num['skipped']}"
    return (f"{num['max_abs_logit_diff']:.3g} over {num['positions']} positions of {num['turns']} served turns "
            f"({num['backend']}, {num['dtype']}); argmax agreement {num['argmax_agreement']:.2%}")


def _frame(c: Canvas, title: str, top: float, labels: list[str]) -> tuple[float, float]:
    c.text(LEFT, 10, title)
    c.line(LEFT, TOP, LEFT, H - BOTTOM, BLACK)
    c.line(LEFT, H - BOTTOM, W - 20, H - BOTTOM, BLACK)
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = TOP + (H - BOTTOM - TOP) * (1 - frac)
        c.line(LEFT - 4, y, W - 20, y, (230, 230, 230))
        c.text(4, int(y) - 5, f"{top * frac:.4g}")
    slot = (W - 20 - LEFT) / max(1, len(labels))
    for i, label in enumerate(labels):
        c.text(int(LEFT + slot * i + 4), H - BOTTOM + 10, label[:14])
    return slot, (H - BOTTOM - TOP)


def _bars(path: Path, title: str, labels: list[str], series: list[tuple[str, list[float]]], hline: float | None = None) -> None:
    c = Canvas(W, H)
    top = max([v for _, vals in series for v in vals if v is not None] + [hline or 0, 1e-9]) * 1.1
    slot, height = _frame(c, title, top, labels)
    bar = max(2, int(slot * 0.8 / max(1, len(series))))
    for si, (name, vals) in enumerate(series):
        color = PALETTE[si % len(PALETTE)]
        for i, v in enumerate(vals):
            if v is None:
                continue
            x0 = int(LEFT + slot * i + 4 + si * bar)
            y0 = int(TOP + height * (1 - v / top))
            for x in range(x0, x0 + bar - 1):
                c.line(x, y0, x, H - BOTTOM, color)
        c.box(W - 200, TOP + 8 + 14 * si, 4, color)
        c.text(W - 190, TOP + 3 + 14 * si, name)
    if hline is not None:
        y = TOP + height * (1 - hline / top)
        c.line(LEFT, y, W - 20, y, GREY, dash=6)
    path.write_bytes(c.png())


def write_report(result: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(result, indent=2))
    (out_dir / "report.md").write_text(markdown(result))
    rows = result["rows"]
    labels = [r["phase"].replace("poisson ", "") for r in rows]
    _bars(out_dir / "latency.png", "latency ms: ttft p50 p95 p99 - tpot p99", labels,
          [(f"ttft {q}", [r[f"ttft_{q}_ms"] for r in rows]) for q in ("p50", "p95", "p99")]
          + [("tpot p99", [r["tpot_p99_ms"] for r in rows])])
    _bars(out_dir / "throughput.png", "completion tokens/s - dashed: one at a time", labels,
          [("tokens/s", [r["tokens_per_s"] for r in rows])], hline=rows[0]["tokens_per_s"])
    hist = result["server"].get("width_histogram", {})
    used = result["server"].get("rows_histogram", {})
    keys = sorted({int(k) for k in [*hist, *used]})
    _bars(out_dir / "widths.png", "decode steps: by padded width and by real rows", [str(k) for k in keys],
          [("width", [hist.get(str(k), 0) for k in keys]), ("rows", [used.get(str(k), 0) for k in keys])])
