"""Model directories: load and save strictly, and fingerprint what was loaded.

A model directory holds `config.json` (format version, architecture, optional model card),
`model.safetensors`, `tokenizer.json` and `chat_template.json`. Loading is strict: a
missing file, a missing, extra or mis-shaped tensor is an error that names it. Nothing is
ever unpickled.

The fingerprint is a sha256 over the config, every weight's bytes, the tokenizer and the
chat template: a saved state records it, so it can never be paired with another model.
What needs no torch (finding a directory, reading its config, the fingerprint's arithmetic,
the fingerprint from cached digests) lives in `modeldir` and is re-exported here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from agent import timings
from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.files import DigestCache
from agent.runtime.fill import fill_model, int8_rows
from agent.runtime.model import LaplaceModel, build_model
from agent.runtime.modeldir import (FP32_DIGEST, MODEL_FILES, MODEL_FORMAT, MODEL_FORMAT_VERSION, PACKAGED_MODELS, QUANT_MODES,
                                    QUANT_SCHEME, RUN_DTYPES, TOKENIZER_DIGEST, ModelLoadError, card_run_dtype, model_fingerprint,
                                    not_a_model_dir, quantized_fingerprint, read_config, resolve_model_path)
from agent.runtime.quant import check_int8_kernels, quantize_loaded
from agent.runtime.weights import Digest, MappedFile, PreparedCache, WeightsFormatError, read_header
from agent.runtime.templates import AnyTemplate, load_chat_template
from agent.runtime.tokenizer import ChatTemplate, Tokenizer, byte_level_tokenizer

# The names `modeldir` holds (torch-free), here too for every importer of this module.
__all__ = ["FP32_DIGEST", "MODEL_FILES", "MODEL_FORMAT", "MODEL_FORMAT_VERSION", "PACKAGED_MODELS", "QUANT_MODES", "QUANT_SCHEME",
           "RUN_DTYPES", "LoadedModel", "ModelLoadError", "card_run_dtype", "fingerprint", "load_model", "load_model_dir",
           "meta_model", "meta_model_for", "model_from_file", "model_from_tensors", "not_a_model_dir", "quantized_fingerprint",
           "read_config", "resolve_model_path", "save_model_dir", "weights_digest"]


@dataclass
class LoadedModel:
    """Everything needed to run a model: weights, tokenizer, chat template, identity."""

    model: LaplaceModel
    tokenizer: Tokenizer
    template: AnyTemplate
    name: str
    path: Path | None = None
    card: dict[str, Any] = field(default_factory=dict)
    _fingerprint: str | None = None

    @property
    def config(self) -> LaplaceConfig:
        return self.model.config

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.model, self.tokenizer, self.template)
        return self._fingerprint


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        # The same bytes as state.tensor_bytes(t), read in place: no copy of a multi-GB model.
        h.update(t.view(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def fingerprint(model: LaplaceModel, tokenizer: Tokenizer, template: AnyTemplate, *, digest: str | None = None,
                tokenizer_digest: str | None = None) -> str:
    """`digest`, `tokenizer_digest`: the weights' and the tokenizer's digests when already
    known (computed while loading the weights, or cached beside the files)."""
    return model_fingerprint(model.config, digest or weights_digest(model), tokenizer_digest or tokenizer.digest(), template)


def save_model_dir(loaded: LoadedModel, path: str | Path, *, card: dict[str, Any] | None = None) -> Path:
    """Write a model directory that `load_model` (and `laplace chat -m DIR`) loads directly."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "model": loaded.config.to_dict(), "card": card if card is not None else loaded.card}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in loaded.model.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": MODEL_FORMAT})
    tmp.replace(out / "model.safetensors")
    loaded.tokenizer.save(out / "tokenizer.json")
    (out / "chat_template.json").write_text(loaded.template.to_json(), encoding="utf-8")
    (out / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return out


class _SkipMetaInit(TorchFunctionMode):
    """Build a model on the meta device without running its layers' initializers there.

    `nn.Embedding` and `nn.Linear` initialize themselves in their constructors even on the
    meta device, and torch runs a meta `normal_` through its Python reference, whose first
    call imports torch._dynamo: 1-2 s of every load, for values that do not exist. A meta
    tensor has no values, so an in-place initializer on one is skipped; any other call, and
    any initializer on a real tensor, runs as usual. (A function mode is per thread.)"""

    FILLS = frozenset({"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                       "xavier_normal_", "orthogonal_", "constant_", "zeros_", "ones_", "fill_", "zero_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by keyword
        if getattr(func, "__name__", "") in self.FILLS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def meta_model(config: LaplaceConfig) -> LaplaceModel:
    """The model of `config` on the meta device (shapes only), built without running any
    initializer (`_SkipMetaInit`): what counting, checking and loading should build."""
    with _SkipMetaInit():
        return build_model(config, device="meta")


def meta_model_for(config: LaplaceConfig, shapes: dict[str, tuple[int, ...]], *, where: str | Path) -> LaplaceModel:
    """The model of `config` on the meta device, once `shapes` (name -> shape of the tensors
    at hand) are exactly its own. A missing, extra or mis-shaped tensor is a ModelLoadError
    naming it and `where`."""
    model = meta_model(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing_t = sorted(set(expected) - set(shapes))
    extra_t = sorted(set(shapes) - set(expected))
    wrong = sorted(k for k in set(expected) & set(shapes) if tuple(shapes[k]) != expected[k])
    problems = []
    if missing_t:
        problems.append(f"missing tensors {missing_t[:5]}")
    if extra_t:
        problems.append(f"unexpected tensors {extra_t[:5]}")
    if wrong:
        problems.append("mis-shaped " + ", ".join(f"{k} {tuple(shapes[k])} != {expected[k]}" for k in wrong[:5]))
    if problems:
        raise ModelLoadError(f"{where} does not match config.json: {'; '.join(problems)}")
    return model


def model_from_tensors(config: LaplaceConfig, tensors: dict[str, torch.Tensor], *, where: str | Path) -> LaplaceModel:
    """The model of `config` holding exactly `tensors` (kept in their dtype, not copied)."""
    model = meta_model_for(config, {k: tuple(v.shape) for k, v in tensors.items()}, where=where)
    model.load_state_dict(tensors, strict=True, assign=True)
    return model


def model_from_file(config: LaplaceConfig, file: Path, *, dtype: torch.dtype = torch.float32,
                    quant: str | None = None, decode_layout: bool = False, cache: bool = True) -> tuple[LaplaceModel, str]:
    """(model, weights digest): the model of `config` read from a safetensors file tensor
    by tensor (`fill.py`), each straight into its final form: `dtype`, or with `quant`
    ("int8") every matmul weight int8 as `quant.quantize_int8_` makes it, built from fp32
    blocks of rows, so peak memory is about the final model's. The digest is
    `weights_digest` of the model loaded in `dtype` (fp32 for a quantized one).

    `decode_layout`: the LM head's matrix (an untied head's, or the tied embedding) stored
    column-major, same values and shape: a batch-1 step's `h @ W.t()` then streams a
    contiguous [d_model, vocab] matrix, which CPU BLAS (MKL here) reads 1.3-2.3x faster
    than the row-major one (a 50k x 768 head, 14 alternating rounds). For inference only:
    training and sharding expect contiguous parameters. Also with it: the projections a
    module names in FUSED (the window mixer's q/k/v, the GLU's gate/up) share one matrix
    (`layers.adopt_fused_`), so a step runs each group as one matmul; they are read straight
    into that matrix (`fill.py`), never held apart first.

    `cache`: keep the digest beside the file (`weights.DigestCache`), so the next load of
    an unchanged file need not read it; with `quant`, keep the int8 rows and scales beside
    it too (`weights.PreparedCache`), so the next load maps them instead of reading the
    fp32 file and quantizing it again (most of an int8 load's time: issue 35)."""
    if quant is not None and quant not in QUANT_MODES:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_MODES)}")
    if quant is not None:
        check_int8_kernels()
        if dtype != torch.float32:
            raise ValueError("int8 weights are for fp32 models on the CPU; use --device cpu and no other dtype")
    try:
        with open(file, "rb") as f:
            infos = read_header(f)
    except (OSError, WeightsFormatError) as exc:
        raise ModelLoadError(f"{file} is unreadable ({exc}); restore the file or re-export the model") from None
    model = meta_model_for(config, {k: v.shape for k, v in infos.items()}, where=file)
    # The digest is of the weights as loaded (fp32 for int8): cached beside the file, so a
    # load whose tensors are all mapped reads none of their bytes.
    digests = DigestCache(file, enabled=cache)
    kind = FP32_DIGEST if quant is not None else str(dtype)  # FP32_DIGEST == str(torch.float32)
    known = digests.get(kind)
    digest = Digest() if known is None else None
    mapped = _mapped(file) if quant is None else None
    # int8: the rows and scales a past load made from this very file, mapped (only with the
    # digest known: a miss reads the fp32 file, which computes the digest on the way).
    prepared = PreparedCache(file, scheme=QUANT_SCHEME, enabled=cache) if quant is not None else None
    hit = prepared.load(int8_rows(model, infos)) if prepared is not None and known is not None else None
    try:
        with open(file, "rb") as f:
            made = fill_model(model, f, infos, dtype=dtype, quant=quant, decode_layout=decode_layout, digest=digest,
                              mapped=mapped, prepared=hit)
    except (OSError, WeightsFormatError) as exc:
        raise ModelLoadError(f"{file} is unreadable ({exc}); restore the file or re-export the model") from None
    left = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:
        raise ModelLoadError(f"{file}: tensors {left[:5]} were not loaded")
    if digest is not None:
        known = digest.hexdigest()
        digests.put(kind, known)
    if made and prepared is not None:
        prepared.save(made)
    assert known is not None
    return model, known


def _mapped(file: Path) -> MappedFile | None:
    """The file mapped for tensors kept in its dtype, or None where it cannot be mapped
    (then every tensor is read)."""
    try:
        return MappedFile(file)
    except (OSError, ValueError):
        return None


def load_model_dir(path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   quant: str | None = None, decode_layout: bool = False) -> LoadedModel:
    """Load a model directory in `dtype`, or with `quant` ("int8", CPU) its matmuls int8:
    either way read straight into that form (`model_from_file`). `decode_layout` (CPU
    inference): the LM head stored the way batch-1 decode reads it fastest."""
    root = Path(path)
    if not root.is_dir():
        raise not_a_model_dir(root)
    missing = [f for f in MODEL_FILES if not (root / f).is_file()]
    if missing:
        raise ModelLoadError(f"model directory {root} is missing {', '.join(missing)}; copy the whole directory or re-export it")
    config, card = read_config(root)
    if quant is not None and torch.device(device).type != "cpu":
        raise ValueError("int8 weights are for fp32 models on the CPU; use --device cpu and no other dtype")
    decode_layout = decode_layout and torch.device(device).type == "cpu"
    # No cache files written into the package's own models (the demo is small to hash).
    cache = PACKAGED_MODELS.resolve() not in root.resolve().parents
    # The tokenizer before the weights: parsing its JSON frees ~17 MB (default model) that
    # glibc keeps, and the weights then reuse it instead of growing the heap past it.
    try:
        with timings.phase("tokenizer and chat template"):
            tokenizer = Tokenizer.from_file(root / "tokenizer.json")
            template = load_chat_template(root / "chat_template.json")
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ModelLoadError(f"tokenizer or chat template in {root} is invalid ({exc})") from None
    with timings.phase("weights (mapped where the file or the int8 cache holds them)"):
        model, digest = model_from_file(config, root / "model.safetensors", dtype=dtype, quant=quant,
                                        decode_layout=decode_layout, cache=cache)
        model = model.to(device=device).eval()
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}")
    lm = LoadedModel(model, tokenizer, template, name=card.get("name", root.name), path=root, card=card)
    # The tokenizer's digest (of its re-serialized JSON: 0.1-0.2 s for a 50k vocabulary) is
    # cached beside tokenizer.json the way the weights' is.
    tok_cache = DigestCache(root / "tokenizer.json", enabled=cache)
    tok_digest = tok_cache.get(TOKENIZER_DIGEST)
    if tok_digest is None:
        tok_digest = tokenizer.digest()
        tok_cache.put(TOKENIZER_DIGEST, tok_digest)
    lm._fingerprint = fingerprint(model, tokenizer, template, digest=digest, tokenizer_digest=tok_digest)
    if quant is not None:
        lm._fingerprint = quantized_fingerprint(lm._fingerprint, quant)
        lm.card = {**card, "weights": quant}
    return lm


def load_model(name_or_path: str, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, models_dir: Path | None = None, seed: int = 0,
               quant: str | None = None, decode_layout: bool = False) -> LoadedModel:
    """Load a model directory, or build a seeded, untrained model from a byte-vocab preset;
    `quant` ("int8"): its matmuls int8 (read straight into that form from a directory)."""
    path = resolve_model_path(name_or_path, models_dir)
    if path is not None:
        return load_model_dir(path, device=device, dtype=dtype, quant=quant, decode_layout=decode_layout)
    if name_or_path in PRESETS:
        config = PRESETS[name_or_path]
        tok = byte_level_tokenizer()
        if config.vocab_size != tok.vocab_size:
            raise ModelLoadError(
                f"preset {name_or_path} has no weights (vocabulary {config.vocab_size}); give a model directory with -m PATH, or use the 'tiny' preset"
            )
        model = build_model(config, device=device, dtype=dtype, seed=seed).eval()
        lm = LoadedModel(model, tok, ChatTemplate(), name=name_or_path, card={"name": name_or_path, "trained": False})
        return lm if quant is None else quantize_loaded(lm, quant)
    if Path(name_or_path).expanduser().is_file():
        raise not_a_model_dir(Path(name_or_path).expanduser())
    known = sorted(PRESETS) + sorted(p.parent.name for p in PACKAGED_MODELS.glob("*/config.json"))
    raise ModelLoadError(f"no model named {name_or_path!r}: not a directory, a user model or a preset (known: {', '.join(known)})")
