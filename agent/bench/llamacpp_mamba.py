"""The Mamba-2 rows of `laplace bench llamacpp`: a random Mamba-2 checkpoint in both runtimes.

A random Mamba2ForCausalLM of a given shape (transformers, fixed seed; the default is
Mamba-2-130M's shape, tied embeddings) is saved once, converted to F32 by llama.cpp's own
converter and to Q8_0 by `llama-quantize`, and imported by laplace. These rows used to run
llama.cpp through llama-cpp-python (a ~20-minute compile, never installed here); they now run
on the same `llama-bench` binary as the default model's rows, with the same protocol. What
was lost with llama-cpp-python is the logit and greedy-token agreement between the two
runtimes; laplace's Mamba-2 against transformers' is held by tests/importers instead.

Needs transformers (the `llamacpp` extra); without it the rows are skipped, not failed.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from agent.bench.llamacpp_build import BuildError, LlamaCpp
from agent.bench.llamacpp_gguf import convert_checkpoint, gguf_dir, quantized

# transformers Mamba2Config arguments. mamba2-130m is state-spaces/mamba2-130m's shape
# (its 50,277-token GPT-NeoX vocabulary padded to a multiple of 16).
SHAPES: dict[str, dict[str, int]] = {
    "mamba2-130m": dict(hidden_size=768, num_hidden_layers=24, vocab_size=50288, state_size=128, head_dim=64,
                        num_heads=24, n_groups=1, conv_kernel=4, expand=2),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, vocab_size=512, state_size=16, head_dim=16, num_heads=8,
                 n_groups=1, conv_kernel=4, expand=2),
}
_ALIASES = {"d_model": "hidden_size", "layers": "num_hidden_layers", "vocab": "vocab_size", "state": "state_size",
            "heads": "num_heads", "groups": "n_groups", "conv": "conv_kernel"}
INSTALL_HINT = "pip install 'laplace[llamacpp]' (transformers, for the random checkpoint and llama.cpp's converter)"


def parse_shape(spec: str | None) -> dict[str, int]:
    """A shape from SHAPES by name, optionally with overrides: "mamba2-130m", "tiny",
    "mamba2-130m,layers=48,d_model=1024" or "d_model=512,layers=8" (on mamba2-130m)."""
    parts = [p.strip() for p in (spec or "mamba2-130m").split(",") if p.strip()]
    base = parts.pop(0) if parts and "=" not in parts[0] else "mamba2-130m"
    if base not in SHAPES:
        raise ValueError(f"unknown shape {base!r}; choose from {', '.join(SHAPES)} (then key=value overrides)")
    shape = dict(SHAPES[base])
    for p in parts:
        key, sep, value = p.partition("=")
        key = _ALIASES.get(key.strip(), key.strip())
        if not sep or key not in shape or not value.strip().isdigit():
            raise ValueError(f"bad shape override {p!r}; keys: {', '.join(sorted(set(shape) | set(_ALIASES)))}, "
                             "each = a whole number")
        shape[key] = int(value)
    d_inner = shape["expand"] * shape["hidden_size"]
    if not any(p.split("=")[0].strip() in ("num_heads", "heads") for p in parts):
        shape["num_heads"] = d_inner // shape["head_dim"]  # heads follow d_model unless set
    if shape["num_heads"] * shape["head_dim"] != d_inner:
        raise ValueError(f"num_heads x head_dim must equal expand x d_model ({d_inner})")
    return shape


def shape_key(shape: dict[str, int], seed: int) -> str:
    """A directory name for one shape and seed, so a different shape never reuses old files."""
    return "mamba2-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items())) + f"-seed{seed}"


def missing_requirements() -> list[str]:
    return [m for m in ("transformers", "numpy") if importlib.util.find_spec(m) is None]


def build_random_checkpoint(root: Path, shape: dict[str, int], *, seed: int = 0) -> Path:
    """A random Mamba2ForCausalLM (tied embeddings) saved with save_pretrained at `root`,
    with a byte-level tokenizer.json for laplace's importer. Returns root."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from agent.runtime.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    if tok.vocab_size > shape["vocab_size"]:
        raise ValueError(f"vocab_size must be at least {tok.vocab_size} (the byte-level tokenizer's)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its shard-writing bar would break the bench's log lines
    torch.manual_seed(seed)
    model = Mamba2ForCausalLM(Mamba2Config(**shape, chunk_size=256, tie_word_embeddings=True)).eval()
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    tok.save(str(root / "tokenizer.json"))
    return root


def gguf_source_view(hf: Path, view: Path) -> Path:
    """The checkpoint as llama.cpp's converter should see it: config and weights only.

    Without tokenizer files the converter writes the GPT-NeoX vocabulary it ships (as it
    does for state-spaces/mamba2-*, which have none); with a tokenizer.json it would take
    its BPE path, which refuses any pre-tokenizer whose hash it does not know. Token ids
    are fed to both runtimes directly, so the two vocabularies never meet."""
    view.mkdir(parents=True, exist_ok=True)
    for f in hf.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors" or f.name.endswith(".safetensors.index.json"):
            link = view / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    return view


def import_checkpoint_dir(hf: Path, dest: Path, name: str) -> Path:
    """`laplace import` semantics through the importer API; returns the model directory."""
    from agent.importers import import_checkpoint

    lm = import_checkpoint(hf, dest, name=name, plain_template=True, source_label=f"random {name}")
    return Path(lm.path or dest)


def prepare(tools: LlamaCpp, home: Path, shape: dict[str, int], *, seed: int = 0) -> tuple[Path, dict[str, Path]]:
    """(laplace model directory, {"F32": gguf, "Q8_0": gguf}) for one shape, made once and kept."""
    missing = missing_requirements()
    if missing:
        raise BuildError(f"the Mamba-2 rows need {', '.join(missing)}; {INSTALL_HINT}, or pass --no-mamba")
    root = gguf_dir(home) / shape_key(shape, seed)
    hf = root / "hf"
    if not (hf / "config.json").is_file():
        shutil.rmtree(hf, ignore_errors=True)
        build_random_checkpoint(hf.with_name("hf.part"), shape, seed=seed).rename(hf)
    f32 = root / "model.F32.gguf"
    if not f32.is_file():
        convert_checkpoint(tools, gguf_source_view(hf, root / "hf-for-gguf"), f32, python=sys.executable)
    ggufs = {"F32": f32, "Q8_0": quantized(tools, f32, "Q8_0", root / "model.Q8_0.gguf")}
    model = root / "laplace"
    if not (model / "config.json").is_file():
        shutil.rmtree(model, ignore_errors=True)
        import_checkpoint_dir(hf, model, "bench-mamba2")
    return model, ggufs
