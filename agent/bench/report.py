"""Run benchmarks by name, print their tables, write one JSON document."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from agent.bench import BenchFn


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_result(console: Console, name: str, result: dict[str, Any]) -> None:
    rows = result.get("rows") or []
    if rows:
        cols = list(dict.fromkeys(k for r in rows for k in r))
        table = Table(title=f"bench {name}", title_justify="left")
        for c in cols:
            table.add_column(c, justify="right")
        for r in rows:
            table.add_row(*(_fmt(r.get(c, "-")) for c in cols))
        console.print(table)
    summary = result.get("summary")
    if summary is None:  # a flat result: show its scalar fields
        summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) and k != "rows"}
    for key, value in summary.items():
        console.print(f"  {key}: {_fmt(value)}")


def run_benches(names: list[str], benches: dict[str, BenchFn], *, quick: bool, out: Path, console: Console,
                on_error: Callable[[str, Exception], None] | None = None) -> dict[str, Any]:
    import torch

    doc: dict[str, Any] = {
        "schema": "laplace-bench/1",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "results": {},
    }
    for name in names:
        console.print(f"[bold]running {name}[/bold]{' (quick)' if quick else ''} ...")
        result = benches[name](quick)
        doc["results"][name] = result
        print_result(console, name, result)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))  # after each bench, so a long run keeps partial results
    console.print(f"wrote {out}")
    return doc
