"""Decode speed and memory of a 1B-shaped imported-family model on the CPU: fp32, bf16, int8.

The model is the `ssd-1b` preset (Llama-3.2-1B widths on the Mamba-2 mixer, as Llamba-1B
is built), randomly initialized: speed and memory do not depend on the values; or, with
`laplace bench cpu1b -m NAME`, a model directory such as an imported checkpoint. fp32 is
the baseline; whether bf16 pays depends on the CPU (`device.has_fast_bf16` measures it,
and the summary records that measurement beside the bf16 row). Each mode runs in its own
child process so its memory is its own, and each is built in its own dtype (on the meta
device, then allocated and initialized in place): no mode holds an fp32 model first.

The int8 row of the random shape is built int8 from the start (random int8 rows and
scales for every matmul and the embedding, the small rest as an init would set it), as
`load_model_dir(quant="int8")` reads a real checkpoint: its peak memory is the int8
model's, never an fp32 model's. Decode is the lean in-place step (`step_`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

CHILD = r"""
import json, sys, time, torch
from agent.runtime.config import PRESETS
from agent.runtime.generation import EagerRunner
from agent.runtime.model import build_model

def kb(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])

def random_int8(config):
    import math
    from agent.runtime.quant import Int8Embedding, int8_linear
    gen = torch.Generator().manual_seed(0)
    model = build_model(config, device="meta")
    params = sum(p.numel() for p in model.parameters())
    def rows(n, k, std):  # uniform int8 rows whose values have standard deviation std
        return torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), torch.full((n,), std * math.sqrt(3) / 127)
    for name, mod in list(model.named_modules()):
        if type(mod) is torch.nn.Linear:
            parent, _, attr = name.rpartition(".")
            bias = None if mod.bias is None else torch.zeros(mod.out_features)
            setattr(model.get_submodule(parent), attr, int8_linear(*rows(mod.out_features, mod.in_features, config.init_std), bias))
    q, s = rows(config.vocab_size, config.d_model, config.init_std)
    model.embed = Int8Embedding(q, s)
    if model.lm_head is None:
        model.lm_head = int8_linear(q, s, None)
    for name, p in list(model.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        if leaf == "conv" or name.endswith("conv.weight"):
            t = torch.randn(p.shape, generator=gen) / math.sqrt(config.conv_size)
        elif leaf == "A_log":
            t = torch.log(1 + 15 * torch.rand(p.shape, generator=gen))
        elif leaf == "dt_bias":
            t = torch.full(p.shape, math.log(math.expm1(0.01)))  # dt = 0.01 at rest
        elif leaf in ("weight", "norm_weight", "D") :
            t = torch.ones(p.shape)
        else:
            t = torch.zeros(p.shape)
        setattr(model.get_submodule(owner), leaf, torch.nn.Parameter(t))
    return model.eval(), params

mode, quick, spec, models_dir = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
if spec == "ssd-1b":
    config = PRESETS["ssd-1b"]
    if quick:
        config = config.replace(n_layers=4, vocab_size=32000)
    if mode == "int8":
        model, params = random_int8(config)
    else:
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        model = build_model(config, device="meta").to(dtype).to_empty(device="cpu").init_weights(0).eval()
        params = sum(p.numel() for p in model.parameters())
else:
    from pathlib import Path
    from agent.runtime.checkpoint import load_model
    model = load_model(spec, models_dir=Path(models_dir), quant="int8" if mode == "int8" else None,
                       dtype=torch.bfloat16 if mode == "bf16" else torch.float32).model
    config = model.config
    params = sum(p.numel() for p in model.parameters())
import gc; gc.collect()
resident = kb("VmRSS")
runner = EagerRunner(model)
ids = torch.randint(0, config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
with torch.inference_mode():
    logits, state = runner.prefill(ids)
    times = []
    token = torch.tensor([int(logits.argmax())])
    for _ in range(8 if quick else 24):
        t = time.perf_counter()
        logits = runner.step_(token, state)
        times.append(time.perf_counter() - t)
        token = logits.argmax(-1)
times = sorted(times[2:])  # the first steps warm caches and allocators
print(json.dumps({"params": params, "resident_kb": resident, "peak_kb": kb("VmHWM"),
                  "ms_per_token": 1000 * times[len(times) // 2], "state_bytes": state.nbytes}))
"""


def _run(mode: str, quick: bool, model: str, models_dir: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, "1" if quick else "0", model, models_dir],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the {mode} run failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_cpu1b(quick: bool, model: str = "ssd-1b", models_dir: str = "") -> dict[str, Any]:
    from agent.runtime.device import cpu_bf16_speedup

    rows = []
    for mode in ("fp32", "bf16", "int8"):
        r = _run(mode, quick, model, models_dir)
        rows.append({"weights": mode, "params": r["params"], "ms_per_token": round(r["ms_per_token"], 1),
                     "tokens_per_s": round(1000 / r["ms_per_token"], 2), "resident_MB": round(r["resident_kb"] / 1024),
                     "peak_MB": round(r["peak_kb"] / 1024), "state_bytes": r["state_bytes"]})
    fp32, bf16, int8 = rows
    return {
        "rows": rows,
        "summary": {
            "model": model if model != "ssd-1b" else
            "ssd-1b, 4 layers and a 32k vocabulary (--quick)" if quick else "ssd-1b (16 layers, 128k vocabulary)",
            "int8_speedup": round(fp32["ms_per_token"] / int8["ms_per_token"], 2),
            "bf16_speedup": round(fp32["ms_per_token"] / bf16["ms_per_token"], 2),
            "bf16_matmul_speedup_measured": round(cpu_bf16_speedup(), 2),
            "int8_resident_share": round(int8["resident_MB"] / fp32["resident_MB"], 2),
            "state_bytes": fp32["state_bytes"],
        },
    }
