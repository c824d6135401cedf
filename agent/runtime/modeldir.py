"""Model directories without torch: find one by name, read its config and card, and say the
fingerprint a load of it would report, from the digests cached beside its files.

A model directory holds `config.json` (format version, architecture, optional model card),
`model.safetensors`, `tokenizer.json` and `chat_template.json`; `checkpoint.py` loads and
saves it with torch. What here needs no weights (naming, reading the config, the card's run
dtype, the fingerprint's arithmetic) is what a torch-free engine (`native.engine`) and every
start of `laplace ask` need before, or instead of, a load: importing this costs no torch.

The fingerprint is a sha256 over the config, the weights' digest, the tokenizer's digest and
the chat template; a quantized model's is derived from its fp32 one (`quantized_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.runtime.config import LaplaceConfig
from agent.runtime.files import DigestCache

if TYPE_CHECKING:
    from agent.runtime.templates import AnyTemplate

MODEL_FORMAT = "laplace-model"
MODEL_FORMAT_VERSION = 1
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.json")
PACKAGED_MODELS = Path(__file__).resolve().parent.parent / "models"  # agent/models
RUN_DTYPES = ("float32", "bfloat16", "int8")
QUANT_MODES = ("int8",)
# Names what `quant.quantize_rows` computes; change it with that arithmetic, so the int8 rows
# a past load kept beside a model file (`weights.PreparedCache`) are made again, not reused.
QUANT_SCHEME = "int8-rows-v1"
# The weights' digest a load caches (`DigestCache` kind): `str(dtype)` of the dtype the
# digest is taken in, fp32 for an fp32 load and for an int8 one (`checkpoint.model_from_file`).
FP32_DIGEST = "torch.float32"
TOKENIZER_DIGEST = "tokenizer"


class ModelLoadError(RuntimeError):
    """A model cannot be found or loaded; the message says which file and what to do."""


def not_a_model_dir(path: Path) -> ModelLoadError:
    """The error for a -m path that is not a directory: a file (often one inside a model
    directory) or nothing at all."""
    if path.exists():
        inside = (path.parent / "config.json").is_file()
        fix = f"pass its directory: -m {path.parent}" if inside else "pass the directory that holds config.json and model.safetensors"
        return ModelLoadError(f"{path} is a file, not a model directory; {fix}")
    return ModelLoadError(f"model directory {path} does not exist")


def read_config(path: str | Path) -> tuple[LaplaceConfig, dict[str, Any]]:
    """(config, card) of a model directory, without touching the weights."""
    if not Path(path).is_dir():
        raise not_a_model_dir(Path(path))
    cfg_path = Path(path) / "config.json"
    try:
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"model directory {path} has no config.json; it is not a laplace model directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({exc}); restore the file or re-export the model") from None
    if meta.get("format") != MODEL_FORMAT:
        raise ModelLoadError(f"{cfg_path} is not a laplace model config (format {meta.get('format')!r})")
    if meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise ModelLoadError(f"{cfg_path} has format version {meta.get('format_version')}; this laplace reads {MODEL_FORMAT_VERSION}: upgrade laplace")
    try:
        config = LaplaceConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{cfg_path} has an invalid model config: {exc}") from None
    return config, dict(meta.get("card") or {})


def resolve_model_path(name_or_path: str, models_dir: Path | None = None) -> Path | None:
    """A directory for `name_or_path`: a path, a user model under LAPLACE_HOME, or a packaged one."""
    p = Path(name_or_path).expanduser()
    if p.is_dir() or "/" in name_or_path or name_or_path.startswith("."):
        return p
    if models_dir and (models_dir / name_or_path).is_dir():
        return models_dir / name_or_path
    if (PACKAGED_MODELS / name_or_path / "config.json").is_file():  # not the trained parts in agent/models/smollm2
        return PACKAGED_MODELS / name_or_path
    return None


def card_run_dtype(name_or_path: str, models_dir: Path | None = None) -> str:
    """The dtype a model directory's card says it runs in (its "dtype": chosen by `laplace
    bench dtype`), float32 when it says none (or for a preset). Reads config.json only."""
    path = resolve_model_path(name_or_path, models_dir)
    try:
        card = json.loads((path / "config.json").read_text()).get("card", {}) if path is not None else {}
    except (OSError, ValueError, AttributeError):
        return "float32"  # the load itself reports an unreadable directory
    dtype = card.get("dtype", "float32") if isinstance(card, dict) else "float32"
    if dtype not in RUN_DTYPES:
        raise ModelLoadError(f"{path}/config.json: card dtype {dtype!r} is not one of {', '.join(RUN_DTYPES)}; fix the card "
                             "or set LAPLACE_DTYPE")
    return dtype


def model_fingerprint(config: LaplaceConfig, weights_digest: str, tokenizer_digest: str, template: AnyTemplate) -> str:
    """The fingerprint of a model: its config, its weights' digest (`checkpoint.weights_digest`),
    its tokenizer's (`Tokenizer.digest`) and its chat template."""
    h = hashlib.sha256()
    h.update(config.to_json().encode())
    h.update(weights_digest.encode())
    h.update(tokenizer_digest.encode())
    h.update(template.to_json().encode())
    return h.hexdigest()


def quantized_fingerprint(base: str, mode: str) -> str:
    """The fingerprint of a model quantized from one whose fingerprint is `base`."""
    return hashlib.sha256(f"{base}+{mode}".encode()).hexdigest()


def cached_fingerprint(model_dir: str | Path, quant: str | None) -> str | None:
    """The fingerprint `checkpoint.load_model_dir(model_dir, quant=quant)` (fp32, or "int8")
    would report, from config.json, chat_template.json and the digests a past load cached
    beside the weights and the tokenizer; the weights are not read. None when either digest
    is not cached or its file changed since (`DigestCache`). Raises ModelLoadError for a
    directory that is not a model's, ValueError for an unknown `quant`."""
    from agent.runtime.templates import load_chat_template  # imports `tokenizers`: only when asked

    if quant is not None and quant not in QUANT_MODES:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_MODES)}")
    root = Path(model_dir)
    config, _ = read_config(root)
    try:
        weights = DigestCache(root / "model.safetensors").get(FP32_DIGEST)
        tokenizer = DigestCache(root / "tokenizer.json").get(TOKENIZER_DIGEST)
    except OSError:  # a file missing: the load says which
        return None
    if weights is None or tokenizer is None:
        return None
    try:
        template = load_chat_template(root / "chat_template.json")
    except Exception:  # the load reports an invalid template (its reader raises its own types)
        return None
    base = model_fingerprint(config, weights, tokenizer, template)
    return base if quant is None else quantized_fingerprint(base, quant)
