"""Device backends: `auto | cpu | cuda | neuron`, resolved by what is really present.

Trainium (TorchNeuron native) activates only when AWS's real `torch_neuronx` imports; the
PyPI package of that name is a placeholder that raises on import, and is never a dependency.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

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
            raise DeviceUnavailableError(f"--device neuron was requested but {why}; see README 'Trainium' for the AWS install steps, or use --device cpu")
        return torch.device("neuron")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if neuron_status()[0]:
        return torch.device("neuron")
    return torch.device("cpu")


def has_fast_bf16(device: torch.device) -> bool:
    """True where bf16 matmuls are fast (GPUs, Trainium). On this class of CPU they are ~50x slower."""
    return device.type in ("cuda", "neuron")


def matmul_dtype(device: torch.device) -> torch.dtype:
    """The dtype for heavy matmuls such as Muon's Newton-Schulz on this device."""
    return torch.bfloat16 if has_fast_bf16(device) else torch.float32


def parse_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose float32, bfloat16 or (CPU inference) int8") from None
