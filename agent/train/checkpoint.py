"""Fine-tuning checkpoints: a loadable model directory plus the trainer's state.

Layout of an output directory:
    config.json, model.safetensors, tokenizer.json, chat_template.json   (--tune all)
    initial.laplace-state                                               (--tune state)
    metrics.jsonl                                                       one line per step
    trainer/optimizer.pt   optimizer state as whole tensors keyed by parameter name
    trainer/state.json     step, tokens, base model identity; written last (commit marker)

Optimizer state is stored as whole (unsharded) tensors, so a run can resume on another
number of ranks; `optimizer.pt` holds only tensors and plain values and is read back with
`torch.load(weights_only=True)`. Learning rates are not taken from the checkpoint: the
trainer re-applies the command line's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agent.train.distributed import DistInfo, barrier, full_tensor, like_param

TRAINER_DIR = "trainer"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
CHECKPOINT_FORMAT = "laplace-finetune"
CHECKPOINT_VERSION = 1


class ResumeError(ValueError):
    """A --resume directory cannot continue this run; the message says why."""


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole CPU tensors of every weight (a collective under FSDP2)."""
    return {k: full_tensor(v.detach()).to("cpu").contiguous() for k, v in model.state_dict().items()}


def optimizer_state(opts: list[torch.optim.Optimizer], names: dict[int, str]) -> list[dict[str, dict[str, torch.Tensor]]]:
    """Per optimizer: {parameter name: {state key: whole tensor}} (a collective under FSDP2)."""
    out = []
    for opt in opts:
        per: dict[str, dict[str, torch.Tensor]] = {}
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p)
                if not state:
                    continue
                per[names[id(p)]] = {k: full_tensor(v).to("cpu").clone() if torch.is_tensor(v) else torch.tensor(v) for k, v in state.items()}
        out.append(per)
    return out


def load_optimizer_state(opts: list[torch.optim.Optimizer], saved: list[dict[str, dict[str, torch.Tensor]]], params: dict[str, nn.Parameter]) -> None:
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
                restored[k] = v.clone() if v.dim() == 0 else like_param(v, p).to(v.dtype)
            opt.state[p] = restored


def save_trainer_state(out: Path, info: DistInfo, *, opts: list[torch.optim.Optimizer], names: dict[int, str], meta: dict[str, Any]) -> None:
    """Write optimizer state and state.json (rank 0), after every rank gathered its part."""
    state = optimizer_state(opts, names)
    if info.is_main:
        tdir = out / TRAINER_DIR
        tdir.mkdir(parents=True, exist_ok=True)
        tmp = tdir / (OPTIMIZER_FILE + ".tmp")
        torch.save({"format": CHECKPOINT_FORMAT, "optimizers": state}, tmp)
        tmp.replace(tdir / OPTIMIZER_FILE)
        doc = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, **meta}
        tmp_json = tdir / (STATE_FILE + ".tmp")
        tmp_json.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        tmp_json.replace(tdir / STATE_FILE)
    barrier(info)


def read_trainer_state(resume: str | Path) -> dict[str, Any]:
    path = Path(resume) / TRAINER_DIR / STATE_FILE
    if not path.is_file():
        raise ResumeError(f"--resume {resume}: no {TRAINER_DIR}/{STATE_FILE}; it is not the --out directory of a laplace finetune run")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResumeError(f"{path} is not valid JSON ({exc})") from None
    if doc.get("format") != CHECKPOINT_FORMAT or doc.get("format_version") != CHECKPOINT_VERSION:
        raise ResumeError(f"{path} is not a version-{CHECKPOINT_VERSION} laplace finetune checkpoint")
    return doc


def read_optimizer_file(resume: str | Path) -> list[dict[str, dict[str, torch.Tensor]]]:
    path = Path(resume) / TRAINER_DIR / OPTIMIZER_FILE
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ResumeError(f"--resume {resume}: {TRAINER_DIR}/{OPTIMIZER_FILE} is missing") from None
    except Exception as exc:  # unpickling errors have several types
        raise ResumeError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise ResumeError(f"{path} is not a laplace finetune optimizer state")
    return data["optimizers"]


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
