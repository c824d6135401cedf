"""Weight deltas: a small safetensors file that changes some of a model's weights.

Three forms, told apart by the header's metadata `format`:
- "add": tensors named exactly like the model's state_dict keys; W += delta.
- "lora": pairs `<key>.lora_A` [r, in] and `<key>.lora_B` [out, r]; W += lora_B @ lora_A
  (any alpha / r scale is already folded into lora_B).
- "replace": new values for the named weights (the default model's shipped GLA branch).
`undo_delta` gives the delta of the same form that takes one out again.

`apply_delta` is strict: an unknown key, a shape that does not fit, a lone half of a pair
or an unknown format is an error, never a silent partial change. Plain safetensors: no
file read here can run code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

DELTA_FORMATS = ("add", "lora", "replace")


class DeltaError(ValueError):
    """A delta file does not fit the model; the message says which tensor and why."""


def lora_pairs(tensors: dict[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """{state_dict key: (A, B)} from a "lora" delta's tensors."""
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    for name in tensors:
        if not name.endswith((".lora_A", ".lora_B")):
            raise DeltaError(f"{name}: a lora delta holds only <key>.lora_A and <key>.lora_B tensors")
        key = name[: -len(".lora_A")]
        if key in pairs:
            continue
        a, b = tensors.get(key + ".lora_A"), tensors.get(key + ".lora_B")
        if a is None or b is None:
            raise DeltaError(f"{key}: lora_A and lora_B come in pairs; one is missing")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise DeltaError(f"{key}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not [r, in] and [out, r]")
        pairs[key] = (a, b)
    return pairs


def delta_weights(tensors: dict[str, Tensor], fmt: str) -> dict[str, Tensor]:
    """{state_dict key: the full additive change of that weight}."""
    if fmt == "add":
        return dict(tensors)
    if fmt == "lora":
        return {k: b.float() @ a.float() for k, (a, b) in lora_pairs(tensors).items()}
    raise DeltaError(f"unknown delta format {fmt!r}; expected one of {', '.join(DELTA_FORMATS)}")


def read_delta(path: str | Path, formats: tuple[str, ...] = DELTA_FORMATS) -> tuple[dict[str, Tensor], str]:
    """(tensors, format) of a delta file whose format is one of `formats`. A file that is not
    safetensors (truncated, corrupt) is a DeltaError naming it; a missing one an OSError."""
    try:
        with safe_open(str(path), framework="pt") as f:
            fmt = (f.metadata() or {}).get("format")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as exc:
        raise DeltaError(f"{path}: not a readable safetensors file ({exc})") from None
    if fmt not in formats:
        raise DeltaError(f"{path}: metadata format {fmt!r} is not one of {', '.join(formats)}")
    return tensors, fmt


def write_delta(path: str | Path, tensors: dict[str, Tensor], fmt: str, metadata: dict[str, str] | None = None) -> Path:
    if fmt not in DELTA_FORMATS:
        raise DeltaError(f"unknown delta format {fmt!r}")
    if fmt == "lora":
        lora_pairs(tensors)  # refuse to write a file apply_delta would refuse
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp), metadata={**(metadata or {}), "format": fmt})
    tmp.replace(out)
    return out


@torch.no_grad()
def apply_delta(model: nn.Module, tensors: dict[str, Tensor], fmt: str) -> list[str]:
    """Add the delta into `model`'s weights in place (in fp32, stored back in each weight's
    dtype), or with `fmt="replace"` set them to `tensors`; returns the keys changed. Checks
    every key and shape before changing any."""
    params = model.state_dict()
    changes = dict(tensors) if fmt == "replace" else delta_weights(tensors, fmt)
    for key, d in changes.items():
        if key not in params:
            raise DeltaError(f"{key}: the model has no such weight")
        if tuple(d.shape) != tuple(params[key].shape):
            raise DeltaError(f"{key}: delta {tuple(d.shape)} does not fit the weight {tuple(params[key].shape)}")
    for key, d in changes.items():
        w = params[key]
        w.copy_(d.to(w.device, w.dtype) if fmt == "replace" else (w.float() + d.to(w.device, torch.float32)).to(w.dtype))
    return sorted(changes)


def undo_delta(model: nn.Module, tensors: dict[str, Tensor], fmt: str) -> dict[str, Tensor]:
    """The delta, in the same format, whose `apply_delta` takes `tensors` out of `model`
    again once they are applied: the negation of an "add" or a "lora" (lora_B negated, so
    the same product is subtracted), or for "replace" the values it replaces, as they are
    now (call it before `apply_delta`)."""
    if fmt == "add":
        return {k: -v for k, v in tensors.items()}
    if fmt == "lora":
        return {k: -v if k.endswith(".lora_B") else v for k, v in tensors.items()}
    if fmt == "replace":
        params = model.state_dict()
        return {k: params[k].detach().to("cpu", copy=True) for k in tensors if k in params}  # apply_delta refuses the rest
    raise DeltaError(f"unknown delta format {fmt!r}; expected one of {', '.join(DELTA_FORMATS)}")
