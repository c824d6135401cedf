"""The default model's teacher and shipped files, made in the test: a tiny random Llama GGUF
inside a fake wheel, and branch / LoRA files shaped for it."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import torch

from agent.importers import default_model
from agent.importers.default_model import Teacher
from agent.runtime.delta import write_delta

from .llama_helpers import llama_gguf

MEMBER = "llm_fake/tiny.gguf"


def fake_wheel(root: Path) -> bytes:
    llama_gguf(root / "tiny.gguf")
    whl = root / "fake.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(root / "tiny.gguf", MEMBER)
        z.writestr("llm_fake/__init__.py", "")
    return whl.read_bytes()


def fake_teacher(url: str, blob: bytes) -> Teacher:
    return Teacher(name="tiny-llama", license="Apache-2.0", package="llm-fake==0.1", url=url, size=len(blob),
                   sha256=hashlib.sha256(blob).hexdigest(), member=MEMBER)


def local_teacher(tmp_path: Path, blob: bytes) -> Teacher:
    """The fake wheel as a file:// mirror."""
    whl = tmp_path / "mirror" / "llm_fake-0.1-py3-none-any.whl"
    whl.parent.mkdir(exist_ok=True)
    whl.write_bytes(blob)
    return fake_teacher(whl.as_uri(), blob)


def write_shipped(shipped: Path, lm_tensors: dict[str, torch.Tensor], *, branch: float | None = 0.25,
                  lora_b: float | None = 0.5) -> Path:
    """A branch file ("replace": every decay_bias set to `branch`) and a LoRA delta on the
    first o_proj (B @ A = 2 * lora_b everywhere), shaped for the tiny Llama; None: no file."""
    shipped.mkdir(parents=True, exist_ok=True)
    if branch is not None:
        values = {k: torch.full_like(v, branch) for k, v in lm_tensors.items() if ".gla_branch." in k and "decay_bias" in k}
        write_delta(shipped / default_model.BRANCH_FILE, values, "replace")
    if lora_b is not None:
        key = lora_key(lm_tensors)
        out_dim, in_dim = lm_tensors[key].shape
        lora = {key + ".lora_A": torch.ones(2, in_dim), key + ".lora_B": torch.full((out_dim, 2), lora_b)}
        write_delta(shipped / default_model.DELTA_FILE, lora, "lora")
    return shipped


def lora_key(lm_tensors: dict[str, torch.Tensor]) -> str:
    return next(k for k in lm_tensors if k.endswith("attn.o_proj.weight"))
