"""Fine-tuning checkpoints: a loadable model directory plus the trainer's state.

Layout of an output directory:
    config.json, model.safetensors, tokenizer.json, chat_template.json   (--tune all)
    initial.laplace-state                                               (--tune state)
    metrics.jsonl, summary.json                                         one line per step; the outcome
    trainer/optimizer.safetensors   optimizer state as whole tensors
    trainer/optimizer.json          which tensor is which, and the non-tensor state
    trainer/state.json              step, tokens, base model identity; written last (commit marker)
    step-000100/ ...                numbered checkpoints (--save-every), each laid out like
                                    the directory itself; the newest --keep stay

The top level holds the latest model, at the end of the run or where --stop-after stopped
it; a numbered checkpoint is written under a temporary name and renamed, so a crash never
leaves a half-written one. `--resume` takes the output
directory (its newest checkpoint, the top level included) or one checkpoint directory.

Optimizer state is stored as whole (unsharded) tensors in safetensors, so a run can resume
on another number of ranks and nothing is ever unpickled; plain values (step counts) live in
the JSON sidecar. Learning rates are not taken from the checkpoint: the trainer re-applies
the command line's (the sidecar records the saved ones for reference).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from agent.train.distributed import DistInfo, barrier, full_tensor, like_param

TRAINER_DIR = "trainer"
STATE_FILE = "state.json"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_INDEX = "optimizer.json"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # version 1: a torch pickle, no longer read
CHECKPOINT_FORMAT = "laplace-finetune"
CHECKPOINT_VERSION = 2
STEP_DIR = re.compile(r"step-(\d{6,})")


class ResumeError(ValueError):
    """A --resume directory cannot continue this run; the message says why."""


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole CPU tensors of every weight (a collective under FSDP2)."""
    return {k: full_tensor(v.detach()).to("cpu").contiguous() for k, v in model.state_dict().items()}


OptimizerState = list[dict[str, dict[str, Any]]]  # per optimizer: {param name: {state key: tensor or value}}


def optimizer_state(opts: list[torch.optim.Optimizer], names: dict[int, str]) -> OptimizerState:
    """Per optimizer: {parameter name: {state key: whole tensor or plain value}} (a
    collective under FSDP2)."""
    out = []
    for opt in opts:
        per: dict[str, dict[str, Any]] = {}
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p)
                if not state:
                    continue
                per[names[id(p)]] = {k: full_tensor(v).to("cpu").clone() if torch.is_tensor(v) else v for k, v in state.items()}
        out.append(per)
    return out


def load_optimizer_state(opts: list[torch.optim.Optimizer], saved: OptimizerState, params: dict[str, nn.Parameter]) -> None:
    if len(saved) != len(opts):
        raise ResumeError(f"checkpoint has {len(saved)} optimizers, this run builds {len(opts)} (was --optimizer or --tune changed?)")
    for opt, per in zip(opts, saved):
        owned = {id(p) for g in opt.param_groups for p in g["params"]}
        for name, state in per.items():
            p = params.get(name)
            if p is None or id(p) not in owned:
                raise ResumeError(f"checkpoint has optimizer state for {name}, which this run does not train that way")
            restored: dict[str, Any] = {}
            for k, v in state.items():
                # AdamW's step counter is a scalar tensor; moments and momentum follow the
                # parameter's layout (a shard of it under FSDP2).
                if not torch.is_tensor(v):
                    restored[k] = v
                else:
                    restored[k] = v.clone() if v.dim() == 0 else like_param(v, p).to(v.dtype)
            opt.state[p] = restored


def _split_tensors(state: OptimizerState) -> tuple[dict[str, torch.Tensor], list[dict[str, dict[str, Any]]]]:
    """Safetensors-ready tensors and a JSON index: each state entry is {"tensor": key} or
    {"value": plain value}."""
    tensors: dict[str, torch.Tensor] = {}
    index = []
    for i, per in enumerate(state):
        entry: dict[str, dict[str, Any]] = {}
        for name, st in per.items():
            entry[name] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    key = f"{i}/{name}/{k}"
                    tensors[key] = v.contiguous()
                    entry[name][k] = {"tensor": key}
                elif isinstance(v, (bool, int, float, str)) or v is None:
                    entry[name][k] = {"value": v}
                else:
                    raise TypeError(f"optimizer state {name}.{k} is a {type(v).__name__}; only tensors and plain values are saved")
        index.append(entry)
    return tensors, index


def _hyperparameters(opts: list[torch.optim.Optimizer]) -> list[list[dict[str, Any]]]:
    """The saved param groups' settings, for the record (a resume applies its own)."""
    plain = (bool, int, float, str, type(None))
    return [[{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
              if k != "params" and (isinstance(v, plain) or (isinstance(v, tuple) and all(isinstance(x, plain) for x in v)))}
             for g in opt.param_groups] for opt in opts]


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def save_trainer_state(out: Path, info: DistInfo, *, opts: list[torch.optim.Optimizer], names: dict[int, str], meta: dict[str, Any]) -> None:
    """Write optimizer state and state.json (rank 0), after every rank gathered its part."""
    state = optimizer_state(opts, names)
    if info.is_main:
        tdir = out / TRAINER_DIR
        tdir.mkdir(parents=True, exist_ok=True)
        tensors, index = _split_tensors(state)
        tmp = tdir / (OPTIMIZER_TENSORS + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": CHECKPOINT_FORMAT})
        tmp.replace(tdir / OPTIMIZER_TENSORS)
        _write_json(tdir / OPTIMIZER_INDEX, {"format": CHECKPOINT_FORMAT, "optimizers": index, "param_groups": _hyperparameters(opts)})
        (tdir / LEGACY_OPTIMIZER_FILE).unlink(missing_ok=True)
        _write_json(tdir / STATE_FILE, {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, **meta})
    barrier(info)


def read_trainer_state(resume: str | Path) -> dict[str, Any]:
    path = Path(resume) / TRAINER_DIR / STATE_FILE
    if not path.is_file():
        raise ResumeError(f"--resume {resume}: no {TRAINER_DIR}/{STATE_FILE}; it is not the --out directory of a laplace finetune run "
                          "(or one of its step-NNNNNN checkpoints)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResumeError(f"{path} is not valid JSON ({exc})") from None
    if doc.get("format") == CHECKPOINT_FORMAT and doc.get("format_version") == 1:
        raise ResumeError(f"--resume {resume} was saved by an older laplace whose optimizer file is a torch pickle, which this "
                          f"version never loads; start a new run from its weights instead: -m {resume}")
    if doc.get("format") != CHECKPOINT_FORMAT or doc.get("format_version") != CHECKPOINT_VERSION:
        raise ResumeError(f"{path} is not a version-{CHECKPOINT_VERSION} laplace finetune checkpoint")
    return doc


def read_optimizer_file(resume: str | Path) -> OptimizerState:
    tdir = Path(resume) / TRAINER_DIR
    try:
        index = json.loads((tdir / OPTIMIZER_INDEX).read_text(encoding="utf-8"))
        tensors = load_file(str(tdir / OPTIMIZER_TENSORS))
    except FileNotFoundError as exc:
        raise ResumeError(f"--resume {resume}: {TRAINER_DIR}/{Path(exc.filename or '').name} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as exc:
        raise ResumeError(f"the optimizer state in {tdir} is unreadable ({exc}); resume from another checkpoint") from None
    if not isinstance(index, dict) or index.get("format") != CHECKPOINT_FORMAT:
        raise ResumeError(f"{tdir / OPTIMIZER_INDEX} is not a laplace finetune optimizer index")
    try:
        return [{name: {k: tensors[e["tensor"]] if "tensor" in e else e["value"] for k, e in st.items()}
                 for name, st in per.items()} for per in index["optimizers"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ResumeError(f"{tdir / OPTIMIZER_INDEX} does not match {OPTIMIZER_TENSORS} (missing {exc}); resume from another checkpoint") from None


# ---- numbered checkpoints ---------------------------------------------------------------


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def saved_step(path: Path) -> int | None:
    """The step of the checkpoint committed in `path`, or None if there is none."""
    try:
        return int(json.loads((path / TRAINER_DIR / STATE_FILE).read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def numbered_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, directory) of the committed numbered checkpoints under `out`, oldest first."""
    found = []
    for d in out.glob("step-*"):
        m = STEP_DIR.fullmatch(d.name)
        if m and d.is_dir() and saved_step(d) is not None:
            found.append((int(m.group(1)), d))
    return sorted(found)


def resolve_resume(resume: str | Path) -> Path:
    """The checkpoint to continue from: `resume` itself when it is a numbered checkpoint,
    else the newest of the output directory's top level and its numbered checkpoints."""
    root = Path(resume)
    if STEP_DIR.fullmatch(root.name):
        return root
    candidates = [(saved_step(d) or s, d) for s, d in numbered_checkpoints(root)]
    top = saved_step(root)
    if top is not None or (root / TRAINER_DIR / STATE_FILE).is_file():
        candidates.append((top if top is not None else -1, root))
    if not candidates:
        return root  # read_trainer_state explains what is missing
    return max(candidates, key=lambda c: (c[0], c[1] == root))[1]


def prune_checkpoints(out: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` numbered checkpoints; returns what was deleted."""
    old = [d for _, d in numbered_checkpoints(out)][:-keep] if keep > 0 else [d for _, d in numbered_checkpoints(out)]
    for d in old:
        shutil.rmtree(d)
    return old


def set_aside_later(out: Path, step: int) -> list[str]:
    """Resuming `out` from an earlier step: rename the checkpoints after `step` (the abandoned
    continuation) so that "newest" means this run's again. Nothing is deleted."""
    moved = []
    for s, d in numbered_checkpoints(out):
        if s > step:
            d.rename(_free_name(out, f"abandoned-{d.name}"))
            moved.append(d.name)
    top = saved_step(out)
    if top is not None and top > step:
        (out / TRAINER_DIR).rename(_free_name(out, f"{TRAINER_DIR}-abandoned-{checkpoint_name(top)}"))
        moved.append(f"{TRAINER_DIR}/ (step {top})")
    return moved


def _free_name(out: Path, name: str) -> Path:
    path, n = out / name, 1
    while path.exists():
        n += 1
        path = out / f"{name}-{n}"
    return path


def check_same_base(doc: dict[str, Any], *, resume: str | Path, config: dict[str, Any], fingerprint: str, name: str, tune: str) -> None:
    base = doc.get("base", {})
    if base.get("config") != config:
        raise ResumeError(
            f"--resume {resume} was trained from model {base.get('name', '?')} ({(base.get('config') or {}).get('name', '?')} shape), "
            f"not {name} ({config.get('name')}); pass the same -m as the original run"
        )
    if base.get("fingerprint") != fingerprint:
        raise ResumeError(
            f"--resume {resume} was trained from another model with the same shape "
            f"({str(base.get('fingerprint'))[:12]} vs {fingerprint[:12]}); pass the same -m as the original run"
        )
    if doc.get("tune") != tune:
        raise ResumeError(f"--resume {resume} was a --tune {doc.get('tune')} run, not --tune {tune}")
