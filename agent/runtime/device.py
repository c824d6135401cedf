"""Device backends: `auto | cpu | cuda | neuron`, resolved by what is really present.

Trainium (TorchNeuron native) activates only when AWS's real `torch_neuronx` imports; the
PyPI package of that name is a placeholder that raises on import, and is never a dependency.
"""

from __future__ import annotations

import importlib
import os
import time
from functools import lru_cache
from typing import Callable

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "neuron")


class DeviceUnavailableError(RuntimeError):
    """An explicitly requested device cannot be used here."""


@lru_cache(maxsize=1)
def neuron_status() -> tuple[bool, str]:
    """(available, reason). Importing torch_neuronx registers the "neuron" device."""
    try:
        importlib.import_module("torch_neuronx")
    except Exception as exc:  # the PyPI placeholder raises a plain exception on import
        return False, f"torch_neuronx is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'})"
    try:
        torch.empty(1, device="neuron")
    except Exception as exc:
        return False, f"torch_neuronx imported but no NeuronCore is usable ({exc})"
    return True, "ok"


def resolve_device(request: str = "auto") -> torch.device:
    """Map a user's request to a torch device, or raise naming what is missing."""
    if request not in DEVICE_CHOICES:
        raise DeviceUnavailableError(f"unknown device {request!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if request == "cpu":
        return torch.device("cpu")
    if request == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "--device cuda was requested but this torch has no usable CUDA (CPU build or no GPU); use --device cpu or install a CUDA build of torch 2.13"
            )
        return torch.device("cuda")
    if request == "neuron":
        ok, why = neuron_status()
        if not ok:
            raise DeviceUnavailableError(f"--device neuron was requested but {why}; see docs/models.md 'Trainium' for the AWS install steps, or use --device cpu")
        return torch.device("neuron")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if neuron_status()[0]:
        return torch.device("neuron")
    return torch.device("cpu")


FAST_BF16_SPEEDUP = 1.0  # bf16 counts as fast on a CPU when its matmul is at least as fast as fp32's


def bf16_matmul_speedup(n: int = 256, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """fp32 time / bf16 time of an n x n matmul on the CPU, each the best of `repeats`
    (alternating, after one warm-up each). About 2 ms at n = 256. Whether bf16 is fast
    depends on the CPU's instructions (AVX512_BF16, AMX) and on torch's kernels for
    them, which no table of device types can know: so it is measured."""
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    pairs = {dtype: (a.to(dtype), a.t().contiguous().to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = {dtype: float("inf") for dtype in pairs}
    for x, y in pairs.values():
        x @ y
    for _ in range(repeats):
        for dtype, (x, y) in pairs.items():
            t = clock()
            x @ y
            best[dtype] = min(best[dtype], clock() - t)
    return best[torch.float32] / max(best[torch.bfloat16], 1e-12)


@lru_cache(maxsize=1)
def cpu_bf16_speedup() -> float:
    """`bf16_matmul_speedup()`, measured once per process; LAPLACE_BF16_SPEEDUP pins it
    instead (e.g. 0 keeps fp32 everywhere: the same numbers in every process and on every
    machine, which the tests and a reproducible training run need)."""
    pinned = os.environ.get("LAPLACE_BF16_SPEEDUP")
    return float(pinned) if pinned else bf16_matmul_speedup()


def has_fast_bf16(device: torch.device) -> bool:
    """True where bf16 matmuls are fast: GPUs and Trainium, and a CPU where a short
    measurement (`cpu_bf16_speedup`, once per process) finds them at least as fast as fp32.
    Some CPUs run bf16 matmuls ~50x slower than fp32, others (AVX512_BF16) ~2x faster."""
    if device.type in ("cuda", "neuron"):
        return True
    return device.type == "cpu" and cpu_bf16_speedup() >= FAST_BF16_SPEEDUP


def matmul_dtype(device: torch.device) -> torch.dtype:
    """The dtype for heavy matmuls such as Muon's Newton-Schulz on this device."""
    return torch.bfloat16 if has_fast_bf16(device) else torch.float32


def parse_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose float32, bfloat16 or (CPU inference) int8") from None
