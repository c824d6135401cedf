"""`python -m agent.bench.llamacpp_cli`: `laplace bench llamacpp` with every knob (rounds,
decode length, threads, a local converter or sdist, keeping the files). The laplace CLI has
--quick and --shape; this is the rest. A module of its own because agent.bench.report
imports the registry that imports agent.bench.llamacpp.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from agent.bench import llamacpp as lc
from agent.bench.report import run_benches


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.bench.llamacpp_cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the tiny shape")
    p.add_argument("--shape", default=None, help=f"{' | '.join(lc.SHAPES)}, then optional key=value overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=lc.AGREE_TOKENS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--converter", type=Path, default=None, help="a llama.cpp source dir holding convert_hf_to_gguf.py, conversion/, gguf-py/")
    p.add_argument("--sdist", type=Path, default=None, help=f"a local llama_cpp_python-{lc.LLAMA_CPP_PYTHON}.tar.gz (sha256-checked) to fill the cache")
    p.add_argument("--keep", type=Path, default=None, help="keep the checkpoint, GGUFs and imported model under this directory")
    p.add_argument("--max-others", type=float, default=0.15,
                   help="run a round again when other processes took more than this share of the CPU meanwhile (1 = never)")
    p.add_argument("--out", "-o", type=Path, default=Path("laplace-bench-llamacpp.json"))
    a = p.parse_args(argv)

    def run(quick: bool) -> dict[str, Any]:
        return lc.bench_llamacpp(quick, shape=a.shape, rounds=a.rounds, decode_tokens=a.decode_tokens, threads=a.threads,
                                 converter=a.converter, sdist=a.sdist, keep=a.keep,
                                 max_others=a.max_others)

    run_benches(["llamacpp"], {"llamacpp": run}, quick=a.quick, out=a.out, console=Console(width=200))
    return 0


if __name__ == "__main__":
    sys.exit(main())
