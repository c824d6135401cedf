"""Optimizer setup: parameters split by role, Muon + AdamW, learning-rate schedules.

`split_parameters` is the one place that decides which optimizer trains a parameter, and
it asserts that every trainable parameter landed in exactly one group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agent.runtime.device import matmul_dtype
from agent.runtime.params import is_block_matrix
from agent.train.muon import Muon

SCHEDULES = ("wsd", "cosine", "constant")


@dataclass
class ParamSplit:
    """Named parameters per optimizer."""

    muon: list[tuple[str, nn.Parameter]]
    adamw: list[tuple[str, nn.Parameter]]

    @property
    def muon_numel(self) -> int:
        return sum(p.numel() for _, p in self.muon)

    @property
    def adamw_numel(self) -> int:
        return sum(p.numel() for _, p in self.adamw)

    def describe(self) -> str:
        """Two lines naming the tensors each optimizer trains, by role (the layer index
        dropped), e.g. `attn.q_proj x30`, so the split can be checked against the model."""
        return (f"Muon  {self.muon_numel:,} parameters in {len(self.muon)} block matrices: {roles(self.muon)}\n"
                f"AdamW {self.adamw_numel:,} parameters in {len(self.adamw)} tensors: {roles(self.adamw)}")


def roles(named: list[tuple[str, nn.Parameter]]) -> str:
    """`blocks.3.attn.q_proj.weight` -> `attn.q_proj [576x576] x30`, in first-seen order;
    "none" for an empty group."""
    counts: dict[str, int] = {}
    shapes: dict[str, str] = {}
    for name, p in named:
        parts = name.split(".")
        if parts[0] == "blocks" and len(parts) > 2 and parts[1].isdigit():
            parts = parts[2:]
        if parts[-1] == "weight" and len(parts) > 1:
            parts = parts[:-1]
        role = ".".join(parts)
        counts[role] = counts.get(role, 0) + 1
        shapes.setdefault(role, "x".join(str(d) for d in p.shape))
    if not counts:
        return "none"
    return ", ".join(f"{r} [{shapes[r]}]" + (f" x{n}" if n > 1 else "") for r, n in counts.items())


def split_parameters(model: nn.Module, *, use_muon: bool = True) -> ParamSplit:
    """Muon for the 2-D matrices inside blocks (`agent.runtime.params.is_block_matrix`, shared
    with `laplace info`), AdamW for everything else.

    With `use_muon=False` (the AdamW-only baseline) every parameter goes to AdamW."""
    muon: list[tuple[str, nn.Parameter]] = []
    adamw: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (muon if use_muon and is_block_matrix(name, p) else adamw).append((name, p))
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    grouped = [id(p) for _, p in muon + adamw]
    assert len(grouped) == len(set(grouped)), "a parameter landed in two optimizer groups"
    assert set(grouped) == trainable, "a trainable parameter is in no optimizer group"
    assert all(p.dim() == 2 for _, p in muon), "Muon only takes 2-D matrices"
    return ParamSplit(muon, adamw)


def build_optimizers(
    split: ParamSplit,
    *,
    muon_lr: float,
    adamw_lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    muon_adjust: str = "match_rms_adamw",
    device: torch.device | None = None,
    process_group: Any = None,
    comm_log: list[dict[str, int]] | None = None,
) -> list[torch.optim.Optimizer]:
    """[Muon, AdamW] (Muon omitted when it has no parameters). Each group remembers its
    base learning rate as `base_lr`; the schedule multiplies it every step.

    AdamW does not decay norms, gains, biases or decay gates (anything below 2-D) nor the
    embedding: only the LM head and other 2-D matrices get `weight_decay`."""
    device = device or torch.device("cpu")
    opts: list[torch.optim.Optimizer] = []
    if split.muon:
        opts.append(
            Muon(
                [p for _, p in split.muon], lr=muon_lr, weight_decay=weight_decay, adjust_lr_fn=muon_adjust,
                ns_dtype=matmul_dtype(device), process_group=process_group, comm_log=comm_log,
            )
        )
    decay = [p for n, p in split.adamw if p.dim() >= 2 and not n.startswith("embed.")]
    no_decay = [p for n, p in split.adamw if not (p.dim() >= 2 and not n.startswith("embed."))]
    groups = [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    if groups:
        # foreach=False: the foreach kernels do not take a mix of DTensor shards on gloo.
        opts.append(torch.optim.AdamW(groups, lr=adamw_lr, betas=betas, eps=1e-8, foreach=False))
    for opt in opts:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    return opts


def lr_factor(step: int, total_steps: int, *, schedule: str = "wsd", warmup: int = 0, decay_fraction: float = 0.2, min_factor: float = 0.0) -> float:
    """Multiplier on the base learning rate at optimizer step `step` (0-based).

    wsd: linear warmup, constant, then linear decay over the last `decay_fraction` of
    steps down to `min_factor`. cosine: warmup, then cosine from 1 to `min_factor`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        decay_steps = max(1, int(round(total_steps * decay_fraction)))
        decay_start = total_steps - decay_steps
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / (decay_steps + 1))  # never exactly 0 on a step
        return 1.0 - (1.0 - min_factor) * progress
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup + 1) / (span + 1))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rates(opts: list[torch.optim.Optimizer], factor: float) -> None:
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
