"""Import public pretrained checkpoints of the family into laplace model directories.

`import_checkpoint(src, dest)` reads a Hugging Face checkpoint directory (Llamba or
Mamba2ForCausalLM), maps its weights onto the `ssd` mixer, renders its chat template into
a `SegmentTemplate`, checks that the result loads and runs, and only then moves it into
place: a failure at any step leaves nothing at `dest`. Imports the runtime only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from agent.importers.chat_format import describe, segment_template
from agent.importers.families import SYNTHESIZED, detect, map_weights
from agent.importers.source import CheckpointError, find_tokenizer, load_weights, read_json
from agent.runtime.checkpoint import LoadedModel, ModelLoadError, load_model_dir, model_from_tensors, save_model_dir
from agent.runtime.tokenizer import Tokenizer

__all__ = ["CheckpointError", "import_checkpoint", "inspect_checkpoint"]


def inspect_checkpoint(src: str | Path) -> tuple[str, dict[str, Any]]:
    """(family, config.json) of a checkpoint directory; family is 'llamba' | 'mamba2'."""
    root = Path(src)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist" + (" (it is a file)" if root.exists() else ""))
    cfg = read_json(root / "config.json")
    return detect(cfg), cfg


def import_checkpoint(
    src: str | Path, dest: str | Path, *, name: str, tokenizer_dir: str | Path | None = None,
    plain_template: bool = False, source_label: str | None = None, work_dir: str | Path | None = None,
) -> LoadedModel:
    """Convert `src` into a model directory at `dest` (which must not exist yet). It is
    written in `work_dir` (default: beside `dest`; on the same filesystem) and renamed into
    place once it loads, so even a killed import leaves no partial model at `dest`."""
    root, out = Path(src), Path(dest)
    if out.exists():
        raise CheckpointError(f"{out} already exists; choose another --out name or remove it first")
    family, cfg = inspect_checkpoint(root)
    files = find_tokenizer(root, Path(tokenizer_dir) if tokenizer_dir else None)
    try:
        tok = Tokenizer.from_file(files.tokenizer_json)
    except Exception as exc:  # tokenizers raises its own Exception type
        raise CheckpointError(f"{files.tokenizer_json} is not a valid tokenizer ({exc}); download it again") from None
    template = segment_template(files, tok, plain=plain_template)
    config, tensors = map_weights(family, cfg, load_weights(root))
    config = config.replace(name=name)
    if tok.vocab_size > config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}; this tokenizer belongs to another model")
    try:
        model = model_from_tensors(config, {k: v.contiguous() for k, v in tensors.items()}, where=root).eval()
    except ModelLoadError as exc:
        raise CheckpointError(f"{exc}; the checkpoint is not a plain model of its family") from None
    card: dict[str, Any] = {"name": name, "family": family, "source": source_label or str(root.resolve()),
                            "weights_dtype": str(next(iter(tensors.values())).dtype).replace("torch.", ""), **describe(template)}
    if family in SYNTHESIZED:
        card["synthesized_parameters"] = SYNTHESIZED[family]
    loaded = LoadedModel(model, tok, template, name=name, card=card)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else out.parent
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=work))
    try:
        save_model_dir(loaded, tmp)
        check = load_model_dir(tmp)  # what a user will load: strict, or we fail here
        tmp.rename(out)
        check.path = out
    except (ModelLoadError, ValueError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"the converted model does not load ({exc}); nothing was written") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return check
