"""What `laplace info` reports, computed without allocating weights where possible."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from safetensors import SafetensorError, safe_open

from agent.runtime.checkpoint import MODEL_FILES, ModelLoadError, meta_model, not_a_model_dir, read_config, resolve_model_path
from agent.runtime.config import PRESETS
from agent.runtime.device import DeviceUnavailableError, resolve_device
from agent.runtime.params import is_block_matrix
from agent.runtime.templates import load_chat_template
from agent.runtime.tokenizer import Tokenizer


class ModelInfoError(RuntimeError):
    pass


def count_on_meta(config: Any, skip: Sequence[str] = ()) -> tuple[int, int]:
    """(all parameters, Muon parameters) counted on a meta-device build: no memory used.
    Names ending in a `skip` suffix (an import's made-up constants) are not counted."""
    model = meta_model(config)  # no initializers on meta: they imported torch._dynamo (1-2 s)
    params = [(name, p) for name, p in model.named_parameters() if not name.endswith(tuple(skip))]
    total = sum(p.numel() for _, p in params)
    muon = sum(p.numel() for name, p in params if is_block_matrix(name, p))
    return total, muon


def check_model_files(root: Path, config: Any) -> None:
    """What loading would refuse, found from the file list, the weights' header and the
    tokenizer and template files: a missing file, a truncated or unreadable
    model.safetensors, tensors that do not fit the config, a tokenizer or chat template
    that does not parse. Raises ModelInfoError naming the file."""
    missing = [f for f in MODEL_FILES if not (root / f).is_file()]
    if missing:
        raise ModelInfoError(f"model directory {root} is missing {', '.join(missing)}; copy the whole directory or re-export it")
    try:
        Tokenizer.from_file(root / "tokenizer.json")
        load_chat_template(root / "chat_template.json")
    except Exception as exc:  # tokenizers raises its own Exception type
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelInfoError(f"tokenizer or chat template in {root} is invalid ({first}); restore the files or re-export the model") from None
    weights = root / "model.safetensors"
    try:
        with safe_open(str(weights), framework="pt") as f:  # checks the header covers the file
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelInfoError(f"{weights} is unreadable ({exc}); restore the file or re-export the model") from None
    expected = {k: tuple(v.shape) for k, v in meta_model(config).state_dict().items()}
    if shapes != expected:
        differ = sorted(set(shapes) ^ set(expected)) or sorted(k for k in expected if shapes[k] != expected[k])
        raise ModelInfoError(f"{weights} does not match config.json (e.g. {', '.join(differ[:3])}); restore the file or re-export the model")


def describe_model(name_or_path: str, *, device: str = "cpu", models_dir: Path | None = None) -> dict[str, Any]:
    try:
        dev = resolve_device(device)
    except DeviceUnavailableError as exc:
        raise ModelInfoError(str(exc)) from None
    card: dict[str, Any] = {}
    path = resolve_model_path(name_or_path, models_dir)
    if path is not None:
        try:
            config, card = read_config(path)
        except ModelLoadError as exc:
            raise ModelInfoError(str(exc)) from None
        check_model_files(path, config)
        source = str(path)
    elif name_or_path in PRESETS:
        config = PRESETS[name_or_path]
        source = "preset"
    elif Path(name_or_path).expanduser().is_file():
        raise ModelInfoError(str(not_a_model_dir(Path(name_or_path).expanduser())))
    else:
        known = ", ".join(sorted(PRESETS))
        raise ModelInfoError(f"no model named {name_or_path!r}: not a model directory or a preset ({known})")
    total, muon = count_on_meta(config, card.get("synthesized_parameters") or ())
    state = config.state_bytes()
    from agent.runtime.state_spec import DTYPE_BYTES as size  # torch-free
    parts = {name: math.prod(shape) * size[dtype] for name, (shape, dtype) in config.state_spec().items()}
    kv = config.kv_cache_bytes(8192)
    return {
        "name": card.get("name", name_or_path),
        "source": source,
        "config": config.to_dict(),
        "parameters": total,
        "muon_parameters": muon,
        "adamw_parameters": total - muon,
        "state_bytes": state,
        "state_parts": parts,  # bytes per state tensor (gla, conv; or win_k, win_v, gla, pos)
        "kv_cache_bytes_8k": kv,
        "kv_cache_ratio_8k": kv / state,
        "half_lives": config.half_lives(),
        "device": str(dev),
        "card": card,
    }
