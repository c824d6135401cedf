"""A process without torch can find a model directory, read it, check the default model's
shipped parameters and know the fingerprint a torch load of it would report
(`modeldir.cached_fingerprint`): what the torch-free engine needs before its first token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.importers.download import sha256_of
from agent.importers.shipped import SETTINGS_FILE, SETTINGS_FORMAT, SHIPPED, SHIPPED_FILES
from agent.runtime.checkpoint import load_model, load_model_dir, save_model_dir
from agent.runtime.config import PRESETS
from agent.runtime.files import DigestCache
from agent.runtime.modeldir import FP32_DIGEST, MODEL_FORMAT, MODEL_FORMAT_VERSION, cached_fingerprint

ROOT = Path(__file__).resolve().parents[2]
TORCH_FREE = ("agent.runtime.modeldir", "agent.runtime.files", "agent.importers.shipped", "agent.recall.horizon", "agent.cli.models")


def _torch_free(code: str) -> str:
    """Run `code` in a fresh interpreter, check it never imported torch, and return its stdout."""
    full = f"import sys\n{code}\nassert 'torch' not in sys.modules, 'torch was imported'"
    res = subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    return save_model_dir(load_model("tiny"), tmp_path / "m")


def test_the_model_directory_modules_import_no_torch() -> None:
    _torch_free("\n".join(f"import {m}" for m in TORCH_FREE))


def test_the_digest_kind_is_torchs_name_of_fp32() -> None:
    assert FP32_DIGEST == str(torch.float32)


def test_the_cached_fingerprint_is_the_one_a_load_reports(model_dir: Path) -> None:
    assert cached_fingerprint(model_dir, None) is None and cached_fingerprint(model_dir, "int8") is None  # nothing cached yet
    fp32 = load_model_dir(model_dir).fingerprint  # caches the weights' and the tokenizer's digests
    int8 = load_model_dir(model_dir, quant="int8").fingerprint
    assert fp32 != int8
    assert cached_fingerprint(model_dir, None) == fp32 and cached_fingerprint(model_dir, "int8") == int8
    code = f"from agent.runtime.modeldir import cached_fingerprint\nprint(cached_fingerprint({str(model_dir)!r}, 'int8'))"
    assert _torch_free(code).strip() == int8


def test_a_changed_weights_file_has_no_cached_fingerprint(model_dir: Path) -> None:
    load_model_dir(model_dir, quant="int8")
    assert cached_fingerprint(model_dir, "int8") is not None
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # the same bytes, but another file as far as any cache knows
    assert cached_fingerprint(model_dir, "int8") is None and cached_fingerprint(model_dir, None) is None
    assert load_model_dir(model_dir, quant="int8").fingerprint == cached_fingerprint(model_dir, "int8")


def test_a_changed_tokenizer_has_no_cached_fingerprint(model_dir: Path) -> None:
    load_model_dir(model_dir)
    tok = model_dir / "tokenizer.json"
    tok.write_bytes(tok.read_bytes())
    assert cached_fingerprint(model_dir, None) is None
    assert DigestCache(model_dir / "model.safetensors").get(FP32_DIGEST) is not None  # the weights' digest still holds


def test_an_unknown_quantization_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        cached_fingerprint(model_dir, "int4")


def test_a_built_default_whose_shipped_files_are_current_is_checked_without_torch(tmp_path: Path) -> None:
    records = [{"file": name, "format": formats[-1], "tensors": 1, "sha256": sha256_of(SHIPPED / name)}
               for name, formats in [*SHIPPED_FILES, (SETTINGS_FILE, (SETTINGS_FORMAT,))] if (SHIPPED / name).is_file()]
    default = tmp_path / "home" / "models" / "default"
    default.mkdir(parents=True)
    meta = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "model": PRESETS["tiny"].to_dict(),
            "card": {"name": "default", "shipped": records}}
    (default / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    code = ("from pathlib import Path\nfrom agent.cli.models import ensure_model\nfrom agent.settings import Settings\n"
            f"ensure_model(Settings(home=Path({str(tmp_path / 'home')!r})), 'default')\nprint('checked')")
    assert _torch_free(code).strip() == "checked"
