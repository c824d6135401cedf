"""Where one batch-1 decode step of a laplace model spends its time: torch.profiler's top
ops by self CPU time, and how many aten calls one step makes.

    python -m agent.bench.decode_profile MODEL_DIR [--steps 32] [--threads 2] [--int8] [--top 15] [--reference]

MODEL_DIR is any laplace model directory (an imported checkpoint, e.g. the Mamba-2 one
`laplace bench llamacpp` keeps under $LAPLACE_HOME/bench/llamacpp/mamba2-*/laplace). The steps
follow a 512-token prefill and a few unprofiled warm-up steps; figures are per step. The
lean in-place step (`LaplaceModel.step_`) is profiled, or with --reference the model's
`forward` at T = 1, which returns a new state every token (the form before the lean step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def profile_decode(model_dir: str | Path, *, steps: int = 32, threads: int = 2, int8: bool = False, top: int = 15,
                   reference: bool = False) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from agent.runtime.checkpoint import load_model_dir
    from agent.runtime.generation import EagerRunner

    torch.set_num_threads(threads)
    lm = load_model_dir(model_dir, quant="int8" if int8 else None, decode_layout=True)
    runner = EagerRunner(lm.model)
    model = lm.model

    def step(tok: Any, state: Any) -> tuple[Any, Any]:
        if reference:
            logits, state = model(tok[:, None], state)
            return logits[:, -1], state
        return runner.step_(tok, state), state

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, lm.model.config.vocab_size, (512,), generator=gen).tolist()
    with torch.inference_mode():
        logits, state = runner.prefill(ids)
        tok = logits.argmax(-1)
        for _ in range(8):
            logits, state = step(tok, state)
            tok = logits.argmax(-1)
        t = time.perf_counter()
        for _ in range(steps):
            logits, state = step(tok, state)
            tok = logits.argmax(-1)
        plain_ms = 1000 * (time.perf_counter() - t) / steps
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t = time.perf_counter()
            for _ in range(steps):
                logits, state = step(tok, state)
                tok = logits.argmax(-1)
            profiled_ms = 1000 * (time.perf_counter() - t) / steps
    events = prof.key_averages()
    total_self_us = sum(e.self_cpu_time_total for e in events)
    aten = [e for e in events if e.key.startswith("aten::")]
    rows = []
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        rows.append({"op": e.key, "calls_per_step": round(e.count / steps, 2),
                     "self_ms_per_step": round(e.self_cpu_time_total / 1000 / steps, 3),
                     "self_pct": round(100 * e.self_cpu_time_total / total_self_us, 1),
                     "total_ms_per_step": round(e.cpu_time_total / 1000 / steps, 3)})
    return {
        "rows": rows,
        "summary": {
            "model": str(model_dir), "weights": "int8" if int8 else "fp32", "threads": threads, "steps": steps,
            "path": "reference (forward, new state per token)" if reference else "lean (step_, in place)",
            "ms_per_step_unprofiled": round(plain_ms, 2), "ms_per_step_profiled": round(profiled_ms, 2),
            "aten_calls_per_step": round(sum(e.count for e in aten) / steps, 1),
            "distinct_aten_ops": len(aten),
            "self_cpu_ms_per_step": round(total_self_us / 1000 / steps, 2),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console

    from agent.bench.report import print_result

    p = argparse.ArgumentParser(prog="python -m agent.bench.decode_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--int8", action="store_true", help="LAPLACE_DTYPE=int8 semantics: int8-weight Linears")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--reference", action="store_true", help="profile forward at T = 1 (a new state per token) instead of step_")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    a = p.parse_args(argv)
    res = profile_decode(a.model_dir, steps=a.steps, threads=a.threads, int8=a.int8, top=a.top, reference=a.reference)
    print_result(Console(width=200), "decode profile", res)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
