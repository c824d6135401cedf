"""Peak memory of prefill: segmented (constant) vs one full pass (grows with length).

Each case runs in its own child process so its peak RSS is its own; the figure reported
is the peak during prefill minus the RSS just before it (model already built)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

# VmHWM is the peak RSS of this process's own address space. (ru_maxrss would not do: Linux
# carries it across fork and exec, so a child of a big parent starts at the parent's peak.)
CHILD = r"""
import json, sys, torch

def peak_kb():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])

from agent.runtime.config import PRESETS
from agent.runtime.generation import EagerRunner
from agent.runtime.model import build_model
n, mode = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = build_model(PRESETS["tiny"], seed=0).eval()
ids = torch.randint(0, 256, (n,)).tolist()
base = peak_kb()
with torch.inference_mode():
    if mode == "segmented":
        EagerRunner(model, segment_len=512).prefill(ids)
    else:
        model(torch.tensor([ids]), last_only=True)
peak = peak_kb()
print(json.dumps({"base_kb": base, "peak_kb": peak}))
"""


def _measure(n: int, mode: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), mode], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {"tokens": n, "mode": mode, "prefill_peak_MB": max(0, data["peak_kb"] - data["base_kb"]) / 1024}


def bench_prefill_memory(quick: bool) -> dict[str, Any]:
    long_n = 20_000 if quick else 100_000
    rows = [_measure(n, mode) for mode in ("segmented", "one-pass") for n in (1_000, long_n)]
    seg = {r["tokens"]: r["prefill_peak_MB"] for r in rows if r["mode"] == "segmented"}
    one = {r["tokens"]: r["prefill_peak_MB"] for r in rows if r["mode"] == "one-pass"}
    return {
        "model": "tiny",
        "rows": rows,
        "summary": {
            "segmented_long_minus_short_MB": seg[long_n] - seg[1_000],
            "one_pass_long_minus_short_MB": one[long_n] - one[1_000],
            "long_tokens": long_n,
        },
    }
