"""`laplace bench dtype -m MODEL`: which weight dtype a model should run in, by measurement.

For each of fp32 (the baseline), bf16 and int8 (int8 weights with fp32 activations, the tied LM
head and the embedding included; `runtime/quant.py`), in its own child process
(`python -m agent.bench.dtype_child`, so each peak RSS is its own), loaded as chat loads it:

- prefill tok/s of a 512-token prompt (from a fresh state), median of 3 rounds;
- decode tok/s: 128 greedy steps of the lean `step_` after that prompt, median of 3;
- peak RSS of the process over load, prefill and decode (before the quality pass);
- quality against fp32 on held-out text (`heldout.txt`: prose written for this bench,
  in no training set; or --text): perplexity and its change in percent, top-1 agreement
  (the share of positions whose argmax is fp32's, the text read in 512-token segments
  with the state carried) and greedy agreement (the share of the 128 greedy tokens equal
  to fp32's, and how many agree before the first difference).

The summary names the fastest decode among the dtypes within 1% of fp32's perplexity.
Where the choice is applied: the model card's "dtype" (`agent/importers/default_model.py`'s
RUN_DTYPE for the default model), which chat and serve load in unless LAPLACE_DTYPE says
otherwise. Timings need a quiet machine: run it alone (`--quick`: tiny sizes, a
correctness run, not a measurement). Without -m the bundled demo model is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HELDOUT = Path(__file__).with_name("heldout.txt")
QUALITY_BUDGET_PCT = 1.0  # a perplexity rise above this needs a reason to be chosen
CHILD_TIMEOUT_S = 900


def _child(model: str, dtype: str, *, models_dir: str, text: Path, quick: bool) -> dict[str, Any]:
    sizes = ["--prefill", "64", "--decode", "8", "--rounds", "1"] if quick else []
    env = {k: v for k, v in os.environ.items() if k != "LAPLACE_DTYPE"}  # the child is told its dtype
    try:
        out = subprocess.run([sys.executable, "-m", "agent.bench.dtype_child", model, dtype, "--models-dir", models_dir,
                              "--text", str(text), *sizes], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {dtype} run took over {CHILD_TIMEOUT_S} s; run the bench alone on a quiet machine") from None
    if out.returncode != 0:
        raise RuntimeError(f"the {dtype} run failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(a: list[int], b: list[int]) -> tuple[float, int]:
    """(share of positions where a and b agree, how many agree before the first difference)."""
    n = min(len(a), len(b))
    same = [x == y for x, y in zip(a[:n], b[:n])]
    prefix = next((i for i, s in enumerate(same) if not s), n)
    return (sum(same) / n if n else 1.0), prefix


def compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows from the children's results; the first run is the fp32 reference."""
    ref = runs[0]
    rows = []
    for r in runs:
        top1, _ = agreement(r["argmax"], ref["argmax"])
        greedy, prefix = agreement(r["greedy"], ref["greedy"])
        rows.append({"dtype": r["dtype"], "prefill_tok_s": round(r["prefill_tok_s"], 1), "decode_tok_s": round(r["decode_tok_s"], 2),
                     "peak_rss_MB": round(r["peak_rss_MB"]), "ppl": round(r["ppl"], 4),
                     "ppl_change_pct": round(100 * (r["ppl"] / ref["ppl"] - 1), 3), "top1_agreement": round(top1, 4),
                     "greedy_agreement": round(greedy, 4), "greedy_same_prefix": prefix})
    return rows


def choose(rows: list[dict[str, Any]]) -> str:
    """The fastest decode among the dtypes within QUALITY_BUDGET_PCT of fp32's perplexity."""
    fit = [r for r in rows if r["ppl_change_pct"] <= QUALITY_BUDGET_PCT]
    return max(fit, key=lambda r: r["decode_tok_s"])["dtype"]


def bench_dtype(quick: bool, model: str = "demo", models_dir: str = "", text: str | None = None) -> dict[str, Any]:
    from agent.bench.dtype_child import DTYPES

    path = Path(text) if text else HELDOUT
    runs = [_child(model, d, models_dir=models_dir, text=path, quick=quick) for d in DTYPES]
    rows = compare(runs)
    return {
        "rows": rows,
        "summary": {
            "model": model,
            "text": path.name,
            "tokens_scored": runs[0]["tokens_scored"],
            "threads": runs[0]["threads"],
            "sizes": "prefill 64, decode 8, 1 round (--quick: not a measurement)" if quick else "prefill 512, decode 128, median of 3",
            "choice": choose(rows),
            "rule": f"fastest decode within {QUALITY_BUDGET_PCT}% of fp32's perplexity",
            "applied_in": "the model card's \"dtype\" (agent/importers/default_model.py RUN_DTYPE for the default model)",
        },
    }
