"""Import public pretrained checkpoints into laplace model directories.

`import_checkpoint(src, dest)` reads a Hugging Face checkpoint directory (Llamba or
Mamba2ForCausalLM onto the `ssd` mixer; LlamaForCausalLM onto the `window` hybrid) or a
llama.cpp GGUF file of a Llama (the window hybrid), renders its chat template into a
`SegmentTemplate`, checks that the result loads and runs, and only then moves it into
place: a failure at any step leaves nothing at `dest`. Imports the runtime only.

Importing the package imports nothing: every `laplace ask` on the default model imports a
module of it (`shipped.shipped_changes`) without torch, so the converters, torch, the
chat-template renderer (jinja2) and the GGUF reader are imported by the functions that use
them, and the package's own names from elsewhere on first use (`__getattr__`).
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from agent.importers.llama import HybridOptions
    from agent.importers.source import CheckpointError
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.config import LaplaceConfig
    from agent.runtime.templates import SegmentTemplate
    from agent.runtime.tokenizer import Tokenizer

__all__ = ["CheckpointError", "HybridOptions", "convert_gguf", "import_checkpoint", "inspect_checkpoint", "install"]
_LAZY = {"CheckpointError": "agent.importers.source", "HybridOptions": "agent.importers.llama"}


def __getattr__(name: str) -> Any:
    """The names `_LAZY` lists, imported on first use (PEP 562): their modules import torch."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def inspect_checkpoint(src: str | Path) -> tuple[str, dict[str, Any]]:
    """(family, config.json) of a checkpoint directory; family is 'llamba' | 'mamba2' | 'llama'."""
    from agent.importers.families import detect
    from agent.importers.source import CheckpointError, read_json

    root = Path(src)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist" + (" (it is a file)" if root.exists() else ""))
    cfg = read_json(root / "config.json")
    return detect(cfg), cfg


def import_checkpoint(
    src: str | Path, dest: str | Path, *, name: str, tokenizer_dir: str | Path | None = None,
    plain_template: bool = False, source_label: str | None = None, work_dir: str | Path | None = None,
    hybrid: HybridOptions | None = None,
) -> LoadedModel:
    """Convert `src` (a checkpoint directory or a GGUF file) into a model directory at
    `dest` (which must not exist yet). It is written in `work_dir` (default: beside `dest`;
    on the same filesystem) and renamed into place once it loads, so even a killed import
    leaves no partial model at `dest`. `hybrid` sets the window hybrid a Llama becomes."""
    from agent.importers.chat_format import segment_template
    from agent.importers.families import SYNTHESIZED, map_weights
    from agent.importers.gguf_source import is_gguf
    from agent.importers.llama import HybridOptions, hf_llama_shape, hybrid_weights
    from agent.importers.source import CheckpointError, find_tokenizer, load_weights
    from agent.runtime.tokenizer import Tokenizer

    root, out = Path(src), Path(dest)
    if out.exists():
        raise CheckpointError(f"{out} already exists; choose another --out name or remove it first")
    label = source_label or str(root.resolve())
    if root.is_file():
        if not is_gguf(root):
            raise CheckpointError(f"{root} is a file but not a GGUF; give a checkpoint directory or a .gguf file")
        if tokenizer_dir is not None:
            raise CheckpointError("a GGUF carries its own tokenizer; drop --tokenizer")
        loaded = convert_gguf(root, name=name, plain=plain_template, label=label, hybrid=hybrid or HybridOptions())
    else:
        family, cfg = inspect_checkpoint(root)
        if hybrid is not None and family != "llama":
            raise CheckpointError(f"window options apply to Llama checkpoints; this one is {family}")
        files = find_tokenizer(root, Path(tokenizer_dir) if tokenizer_dir else None)
        try:
            tok = Tokenizer.from_file(files.tokenizer_json)
        except Exception as exc:  # tokenizers raises its own Exception type
            raise CheckpointError(f"{files.tokenizer_json} is not a valid tokenizer ({exc}); download it again") from None
        template = segment_template(files, tok, plain=plain_template)
        if family == "llama":
            config, tensors = hybrid_weights(hf_llama_shape(cfg), load_weights(root), hybrid or HybridOptions(), name=name)
        else:
            config, tensors = map_weights(family, cfg, load_weights(root))
            config = config.replace(name=name)
        card = {"name": name, "family": family, "source": label,
                "weights_dtype": str(next(iter(tensors.values())).dtype).replace("torch.", "")}
        if family in SYNTHESIZED:
            card["synthesized_parameters"] = SYNTHESIZED[family]
        loaded = _loaded(config, tensors, tok, template, card, where=root)
    return install(loaded, out, work_dir)


def convert_gguf(path: Path, *, name: str, label: str, hybrid: HybridOptions, plain: bool = False) -> LoadedModel:
    """A Llama GGUF as an in-memory window hybrid (not yet installed anywhere)."""
    from agent.importers.chat_format import segment_template
    from agent.importers.gguf_source import read_gguf
    from agent.importers.llama import hybrid_weights

    g = read_gguf(path)
    config, tensors = hybrid_weights(g.shape, g.tensors, hybrid, name=name)
    template = segment_template(g.files, g.tokenizer, plain=plain)
    quants = ", ".join(f"{k} x{v}" for k, v in sorted(g.quants.items(), key=lambda kv: -kv[1]))
    card = {"name": name, "family": "llama", "source": label, "teacher": g.name, "gguf_quants": quants, "weights_dtype": "float32"}
    return _loaded(config, tensors, g.tokenizer, template, card, where=path)


def _loaded(config: LaplaceConfig, tensors: dict[str, Any], tok: Tokenizer, template: SegmentTemplate, card: dict[str, Any],
            *, where: Path) -> LoadedModel:
    from agent.importers.chat_format import describe
    from agent.importers.source import CheckpointError
    from agent.runtime.checkpoint import LoadedModel, ModelLoadError, model_from_tensors

    if tok.vocab_size > config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}; this tokenizer belongs to another model")
    try:
        model = model_from_tensors(config, {k: v.contiguous() for k, v in tensors.items()}, where=where).eval()
    except ModelLoadError as exc:
        raise CheckpointError(f"{exc}; the checkpoint is not a plain model of its family") from None
    return LoadedModel(model, tok, template, name=config.name, card={**card, **describe(template)})


def install(loaded: LoadedModel, out: Path, work_dir: str | Path | None,
            extra: Callable[[Path], None] | None = None) -> LoadedModel:
    """Write `loaded` in a temporary directory, load it back strictly, then rename it to `out`.
    `extra(dir)` writes any further files into the directory before it is renamed."""
    from agent.importers.source import CheckpointError
    from agent.runtime.checkpoint import ModelLoadError, load_model_dir, save_model_dir

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else out.parent
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=work))
    try:
        save_model_dir(loaded, tmp)
        if extra is not None:
            extra(tmp)
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
