"""`python -m agent.bench.llamacpp_cli`: `laplace bench llamacpp` with every knob.

The laplace CLI has `-m default`, `--shape` and `--quick`; this adds the protocol (threads,
prompt, gen, depth), rounds, a llama.cpp build of your own (`--llama-cpp DIR`), the Mamba-2
rows left out, and the load limits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.bench.llamacpp import BENCH_ERRORS, EXIT_UNDER_LOAD, QUICK, bench_for_settings, under_load
from agent.bench.llamacpp_mamba import parse_shape
from agent.bench.llamacpp_measure import Protocol
from agent.bench.llamacpp_report import MAX_LOAD, MAX_OTHERS
from agent.settings import Settings

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.bench.llamacpp_cli", description=__doc__.split("\n\n")[0])
    d = Protocol()
    p.add_argument("--quick", action="store_true", help="one round of a small protocol on the tiny Mamba-2 shape")
    p.add_argument("--rounds", type=int, default=None, help="rounds, alternating (default 3; 1 with --quick)")
    p.add_argument("--threads", "-t", type=int, default=d.threads)
    p.add_argument("--prompt", "-p", type=int, default=None, help=f"prefill tokens (default {d.prompt})")
    p.add_argument("--gen", "-n", type=int, default=None, help=f"decode tokens (default {d.gen})")
    p.add_argument("--depth", "-d", type=int, default=None, help=f"tokens read before each (default {d.depth})")
    p.add_argument("--shape", default=None, help="the Mamba-2 rows' shape: mamba2-130m | tiny, then key=value overrides")
    p.add_argument("--no-mamba", action="store_true", help="leave out the Mamba-2 rows")
    p.add_argument("--llama-cpp", type=Path, default=None, help="a llama.cpp build with bin/llama-bench, bin/llama-quantize")
    p.add_argument("--jobs", "-j", type=int, default=2, help="cmake build jobs, when llama.cpp is built (once)")
    p.add_argument("--max-load", type=float, default=MAX_LOAD, help="1-min load average allowed before the run")
    p.add_argument("--max-others", type=float, default=MAX_OTHERS, help="CPU share others may take during a child")
    p.add_argument("--settle", type=float, default=None, help="seconds to wait for the load to fall after setup (180)")
    p.add_argument("--out", "-o", type=Path, default=Path("laplace-bench-llamacpp.json"))
    return p


def options_from(a: argparse.Namespace) -> dict[str, Any]:
    """bench_llamacpp's keyword arguments; ValueError for bad ones."""
    if a.rounds is not None and a.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {a.rounds}")
    if a.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {a.jobs}")
    if a.shape is not None:
        parse_shape(a.shape)
    base = QUICK if a.quick else Protocol()
    protocol = Protocol(threads=a.threads, prompt=a.prompt or base.prompt, gen=a.gen or base.gen,
                        depth=base.depth if a.depth is None else a.depth)
    return {"rounds": a.rounds, "protocol": protocol, "mamba_shape": a.shape, "with_mamba": not a.no_mamba,
            "llama_cpp_dir": a.llama_cpp, "jobs": a.jobs, "max_load": a.max_load, "max_others": a.max_others,
            "settle_s": a.settle}


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console

    from agent.bench.report import run_benches

    a = parser().parse_args(argv)
    try:
        options = options_from(a)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    try:
        doc = run_benches(["llamacpp"], {"llamacpp": lambda quick: bench_for_settings(settings, quick, **options)},
                          quick=a.quick, out=a.out, console=Console(width=200))
    except BENCH_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return EXIT_UNDER_LOAD if under_load(doc) else 0


if __name__ == "__main__":
    sys.exit(main())
