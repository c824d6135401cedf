"""Peak memory: of prefill, segmented (constant) vs one full pass (grows with length); and
of `laplace finetune` on the default model, its defaults vs the old whole-step pass.

Each case runs in its own child process so its peak RSS is its own; for prefill the figure
reported is the peak during prefill minus the RSS just before it (model already built), for
fine-tuning the whole process's peak (what the kernel's OOM killer sees)."""

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


# ---- fine-tuning: peak RSS of `laplace finetune` steps on the default model ---------------

# One run of the trainer in a fresh process: the base model loaded by the trainer itself (as
# `laplace finetune` does), a few steps on a generated text file, then the process's VmHWM.
FINETUNE_CHILD = r"""
import json, sys, time
from pathlib import Path
import torch

def rss_mb(key):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) / 1024

from agent.train.config import TrainConfig
from agent.train.loop import Trainer
kw, models_dir = json.loads(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
start = rss_mb("VmRSS")
t = Trainer(TrainConfig(**kw), models_dir=models_dir)
summary = t.run()
steps = [m["step_s"] for m in t.history]
est = t.memory_estimate
print(json.dumps({"peak_MB": rss_mb("VmHWM"), "imports_MB": start, "estimate_MB": est.total / 2**20, "micro_batch": t.micro,
                  "rows_per_step": t.rows_per_step, "seq_len": t.seq_len, "recompute": kw.get("recompute", True),
                  "step_s": steps, "loss": summary["final_loss"]}))
"""


def _finetune_case(label: str, kw: dict[str, Any], models_dir: str, workdir: str) -> dict[str, Any]:
    import os

    kw = {"data": (os.path.join(workdir, "notes.txt"),), "out": os.path.join(workdir, label), "base": "default", **kw}
    proc = subprocess.run([sys.executable, "-c", FINETUNE_CHILD, json.dumps(kw), models_dir], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        # A negative code is a signal: -9 is the kernel's OOM killer, the failure this bench guards.
        return {"case": label, "ok": False, "returncode": proc.returncode, "error": tail[0]}
    return {"case": label, "ok": True, **json.loads(proc.stdout.strip().splitlines()[-1])}


def bench_finetune_memory(quick: bool, models_dir: str | None = None) -> dict[str, Any]:
    """Peak RSS of `laplace finetune` on the default model with its default options (per-block
    recompute, micro-batch by budget, sequences of 1,024 x 4 per step), against the old
    behaviour (no recompute, the whole step in one pass) at a length where that still fits.

    `quick` runs 1 step at 256 tokens per sequence; the full bench 2 default steps. Needs the
    default model built in `models_dir` (any `laplace chat` builds it); `laplace bench
    finetune-memory` passes the user's."""
    import random
    import tempfile
    from pathlib import Path

    mdir = models_dir or ""
    if not mdir or not (Path(mdir) / "default" / "config.json").is_file():
        return {"skipped": f"the default model is not built in {mdir}; run `laplace chat` once to build it", "rows": [], "summary": {}}
    seq = 256 if quick else 1024
    with tempfile.TemporaryDirectory(prefix="laplace-bench-ftmem-") as tmp:
        rng = random.Random(0)
        words = "the a cat dog house river tree walked quickly under over blue green small large morning evening".split()
        text = "\n\n".join(" ".join(rng.choice(words) for _ in range(400)) for _ in range(60))
        Path(tmp, "notes.txt").write_text(text, encoding="utf-8")
        steps = 1 if quick else 2
        rows = [
            _finetune_case("old: no recompute, whole step per pass", {"steps": 1, "seq_len": 256, "batch_tokens": 4 * 256,
                                                                      "micro_batch": 4, "recompute": False}, mdir, tmp),
            _finetune_case("defaults", {"steps": steps, **({"seq_len": seq} if quick else {})}, mdir, tmp),
            _finetune_case("defaults, --tune lora", {"steps": steps, "tune": "lora", **({"seq_len": seq} if quick else {})}, mdir, tmp),
        ]
    ok = {r["case"]: r for r in rows if r["ok"]}
    default = ok.get("defaults")
    old = ok.get("old: no recompute, whole step per pass")
    return {
        "model": "default",
        "rows": rows,
        "summary": {
            "default_peak_MB": default and round(default["peak_MB"]),
            "default_fits_4GB": bool(default and default["peak_MB"] <= 4096),
            "default_estimate_MB": default and round(default["estimate_MB"]),
            "old_at_256x4_peak_MB": old and round(old["peak_MB"]),
            "seq_len": seq,
        },
    }
