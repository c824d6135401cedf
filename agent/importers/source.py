"""Reading a Hugging Face checkpoint directory: config, weights, tokenizer files.

Weights come from `model.safetensors`, a sharded `model.safetensors.index.json`, or (only if
no safetensors exist) `pytorch_model.bin` read with `torch.load(weights_only=True)`, which
refuses anything but tensors. Every problem is a `CheckpointError` naming the file and
what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


class CheckpointError(ValueError):
    """A checkpoint cannot be imported; the message names the cause and the fix."""


def read_json(path: Path, *, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path} is missing; give the checkpoint's whole directory (config.json, weights, tokenizer)")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); download the file again") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object; download the file again")
    return data


def load_weights(root: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint, by name, in their stored dtype."""
    single = root / "model.safetensors"
    index = root / "model.safetensors.index.json"
    files: list[Path]
    if single.is_file():
        files = [single]
    elif index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        if not shards:
            raise CheckpointError(f"{index} lists no weight files; download the checkpoint again")
        files = [root / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{root} is missing weight shards {', '.join(missing[:3])}; finish the download (laplace pull resumes)")
    elif (root / "pytorch_model.bin").is_file():
        return _load_torch_bin(root / "pytorch_model.bin")
    else:
        raise CheckpointError(f"{root} has no weights (model.safetensors, a sharded index or pytorch_model.bin)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{f} is unreadable ({exc}); it may be truncated: download it again") from None
    return tensors


def _load_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)  # tensors only: never unpickles code
    except Exception as exc:  # torch raises many types for a bad or unsafe file
        raise CheckpointError(f"{path} cannot be read as plain tensors ({type(exc).__name__}); use a safetensors copy of the checkpoint") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"{path} is not a dict of tensors; use a safetensors copy of the checkpoint")
    return dict(data)


@dataclass
class TokenizerFiles:
    """What the tokenizer side of a checkpoint says."""

    tokenizer_json: Path
    config: dict[str, Any] = field(default_factory=dict)  # tokenizer_config.json
    generation: dict[str, Any] = field(default_factory=dict)  # generation_config.json
    chat_template: str | None = None

    def special(self, key: str) -> str | None:
        """bos_token / eos_token as a string (tokenizer_config stores a string or a dict)."""
        v = self.config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) and v else None


def find_tokenizer(root: Path, tokenizer_dir: Path | None = None) -> TokenizerFiles:
    """tokenizer.json and its side files, from `tokenizer_dir` if given, else the checkpoint."""
    where = tokenizer_dir or root
    tj = where / "tokenizer.json"
    if not tj.is_file():
        hint = "pass --tokenizer DIR (or a repo id with laplace pull) naming a tokenizer.json for this model"
        raise CheckpointError(f"{where} has no tokenizer.json; {hint}")
    config = read_json(where / "tokenizer_config.json", required=False)
    generation = read_json(root / "generation_config.json", required=False) or read_json(where / "generation_config.json", required=False)
    template = None
    jinja = where / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    else:
        raw = config.get("chat_template")
        if isinstance(raw, list):  # [{"name": "default", "template": ...}, ...]
            raw = next((t.get("template") for t in raw if isinstance(t, dict) and t.get("name") == "default"), None)
        template = raw if isinstance(raw, str) and raw.strip() else None
    return TokenizerFiles(tj, config, generation, template)


def take(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Remove and return one tensor, or say which one is missing."""
    try:
        return tensors.pop(name)
    except KeyError:
        raise CheckpointError(f"the checkpoint has no tensor {name!r}; it is not the architecture its config.json claims") from None


def expect_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise CheckpointError(f"tensor {name} has shape {tuple(t.shape)}, but config.json implies {shape}; the config and weights do not match")
    return t
