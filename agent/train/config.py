"""`TrainConfig`: everything one fine-tuning run needs, validated up front.

The same dataclass is filled by `laplace finetune` (Typer) and by `python -m agent.train`
(argparse, for torchrun), so both entry points validate identically and a bad value is
reported before any data is read or a model loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from agent.train.lora import DEFAULT_TARGETS, LORA_TARGETS
from agent.train.optim import SCHEDULES

TUNE_CHOICES = ("all", "state", "lora")
PACK_CHOICES = ("stream", "rows")
DEFAULT_LORA_TARGETS = ",".join(DEFAULT_TARGETS)
OPTIMIZER_CHOICES = ("muon", "adamw")
LR_RANGE = (1e-7, 1.0)


class TrainConfigError(ValueError):
    """An invalid combination of options; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    data: tuple[str, ...]
    out: str
    base: str = "tiny"
    steps: int | None = None
    tokens: int | None = None
    seq_len: int | None = None  # default: 16 chunks (2,048 tokens at chunk 128)
    batch_tokens: int | None = None  # default: 4 rows of seq_len
    micro_batch: int | None = None  # rows per forward/backward; default: as many as fit agent.train.memory's budget
    recompute: bool = True  # per-block activation checkpointing (agent/train/memory.py): ~1/3 more compute, a fraction of the memory
    lr: float = 3e-4  # serves both optimizers (Muon uses the match-AdamW-RMS scaling)
    muon_lr: float | None = None
    adamw_lr: float | None = None
    muon_adjust: str = "match_rms_adamw"
    weight_decay: float = 0.0
    schedule: str = "wsd"
    warmup: int | None = None  # default: 5% of steps, at most 100
    decay_fraction: float = 0.2
    clip: float = 1.0
    optimizer: str = "muon"
    tune: str = "all"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: str = DEFAULT_LORA_TARGETS  # comma-separated linear names (agent.train.lora.LORA_TARGETS)
    lora_ranks: str = ""  # per-target ranks over lora_rank, "q_proj=64,k_proj=64"
    init_lora: str | None = None  # --tune lora: start from this "lora" delta's adapters (a new run, not a resume)
    pack: str = "stream"  # stream: documents run on across rows | rows: each document starts a row
    eval: tuple[str, ...] = ()
    eval_every: int | None = None  # default: 10 evals per run
    eval_rows: int = 64
    resume: str | None = None
    save_every: int | None = None  # default: at the end only
    stop_after: int | None = None  # stop (with a checkpoint) after this step, as if preempted
    keep: int = 3  # numbered checkpoints kept (the newest)
    on_bad: str = "skip"
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    distributed: bool = False

    def __post_init__(self) -> None:
        if not self.data:
            raise TrainConfigError("give at least one data file or folder")
        if (self.steps is None) == (self.tokens is None):
            raise TrainConfigError("give exactly one of --steps or --tokens")
        for name in ("steps", "tokens", "seq_len", "batch_tokens", "micro_batch", "eval_every", "save_every", "stop_after", "keep", "warmup", "lora_rank"):
            value = getattr(self, name)
            if value is not None and (value <= 0 if name != "warmup" else value < 0):
                raise TrainConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
        for name in ("lr", "muon_lr", "adamw_lr"):
            value = getattr(self, name)
            if value is not None and not LR_RANGE[0] <= value <= LR_RANGE[1]:
                raise TrainConfigError(f"--{name.replace('_', '-')} {value} is out of range; use a learning rate in [{LR_RANGE[0]:g}, {LR_RANGE[1]:g}] (typical: 1e-4 to 3e-3)")
        if not 0 <= self.weight_decay < 1:
            raise TrainConfigError(f"--weight-decay must be in [0, 1), got {self.weight_decay}")
        if self.clip < 0:
            raise TrainConfigError(f"--clip must be >= 0 (0 disables clipping), got {self.clip}")
        if not 0 < self.decay_fraction <= 1:
            raise TrainConfigError(f"--decay-fraction must be in (0, 1], got {self.decay_fraction}")
        choices = {"schedule": SCHEDULES, "tune": TUNE_CHOICES, "pack": PACK_CHOICES, "optimizer": OPTIMIZER_CHOICES, "on_bad": ("skip", "error"),
                   "muon_adjust": ("match_rms_adamw", "original", "none"), "dtype": ("float32", "fp32", "bfloat16", "bf16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise TrainConfigError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.tune == "state" and self.distributed:
            raise TrainConfigError("--tune state trains one small tensor; run it in a single process (without --distributed)")
        if self.tune == "lora":
            if self.distributed:
                raise TrainConfigError("--tune lora trains small adapters; run it in a single process (without --distributed)")
            bad = [t for t in self.lora_target_names if t not in LORA_TARGETS]
            if bad or not self.lora_target_names:
                raise TrainConfigError(f"--lora-targets {self.lora_targets!r}: choose from {', '.join(LORA_TARGETS)}")
            if self.lora_alpha <= 0:
                raise TrainConfigError(f"--lora-alpha must be positive, got {self.lora_alpha}")
            _ = self.lora_rank_of  # --lora-ranks parses, or the error names it
        elif self.init_lora is not None:
            raise TrainConfigError("--init-lora starts LoRA adapters; use it with --tune lora")
        elif self.lora_ranks:
            raise TrainConfigError("--lora-ranks sets LoRA adapters' ranks; use it with --tune lora")

    @property
    def lora_target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())

    @property
    def lora_rank_of(self) -> dict[str, int]:
        """The rank of each adapted target: `lora_rank`, or its `lora_ranks` entry."""
        ranks = dict.fromkeys(self.lora_target_names, self.lora_rank)
        for item in (i.strip() for i in self.lora_ranks.split(",") if i.strip()):
            name, sep, value = item.partition("=")
            if not sep or not value.strip().isdigit() or int(value) < 1:
                raise TrainConfigError(f"--lora-ranks {self.lora_ranks!r}: give TARGET=RANK pairs, RANK >= 1 (e.g. q_proj=64,k_proj=64)")
            if name.strip() not in ranks:
                raise TrainConfigError(f"--lora-ranks names {name.strip()!r}, which --lora-targets ({self.lora_targets}) does not adapt; "
                                       "add it there too")
            ranks[name.strip()] = int(value)
        return ranks

    @property
    def muon_base_lr(self) -> float:
        return self.muon_lr if self.muon_lr is not None else self.lr

    @property
    def adamw_base_lr(self) -> float:
        return self.adamw_lr if self.adamw_lr is not None else self.lr

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["data"], d["eval"] = list(self.data), list(self.eval)
        return d

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
