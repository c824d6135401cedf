"""The one training call every stage of the plan makes, and the recipe's log lines.

Each `plan.Stage` becomes one `TrainConfig` (the project's own Trainer, `laplace
finetune`'s engine: Muon for block matrices, AdamW for the rest) on one WSD schedule;
answers are weighted in the loss (`weighted.WeightedTrainer`), and phase 5's decision
tokens too (`weighted.FocusTrainer`).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import torch

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.tokenizer import ChatTemplate, Tokenizer
from agent.train.config import TrainConfig
from recipes.demo_model.corpus import Passage
from recipes.demo_model.plan import BATCH_TOKENS, FOCUS_WEIGHT, Stage
from recipes.demo_model.weighted import FocusTrainer, WeightedTrainer


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def log_progress(m: dict[str, Any]) -> None:
    if m["step"] % 10 == 0 or m["step"] == 1:
        log(f"step {m['step']}/{m['total_steps']} loss {m['loss']:.3f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s")


def train_stage(stage: Stage, *, data: Path, run: Path, base_dir: Path, base: LoadedModel, seed: int,
                answers: re.Pattern[str] | None = None) -> dict[str, Any]:
    """Train `stage` on the data folder `data` into `run` (resumed there when the stage
    continues a run), from the model at `base_dir` (`base`, loaded); the trainer's summary.
    `answers` matches the replies whose loss is weighted (default: `weighted.ANSWER`)."""
    s = stage.schedule
    cfg = TrainConfig(data=(str(data),), out=str(run), base=str(base_dir), steps=s.total, seq_len=stage.rows,
                      batch_tokens=BATCH_TOKENS, lr=s.lr, warmup=s.warmup, schedule="wsd", decay_fraction=s.decay,
                      resume=str(run) if stage.resume else None, stop_after=stage.steps[1], seed=seed, device="cpu")
    if stage.focus:
        trainer: WeightedTrainer = FocusTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=stage.answer_weight,
                                                answers=answers, focus=stage.focus, focus_weight=FOCUS_WEIGHT,
                                                focus_only=stage.focus_only)
    else:
        trainer = WeightedTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=stage.answer_weight,
                                  answers=answers)
    return trainer.run()


def held_out_perplexity(forward: Any, tok: Tokenizer, template: ChatTemplate, passages: list[Passage], window: int = 256) -> float:
    """exp(mean NLL) over the held-out docstrings, in windows of `window` tokens from a
    fresh state (the same windows for every model)."""
    ids: list[int] = []
    for p in passages:
        ids += [tok.token_id(template.bos_token)] + tok.encode(p.text)
    total, count = 0.0, 0
    with torch.inference_mode():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[s : s + window + 1]])
            if chunk.shape[1] < 2:
                break
            logits = forward(chunk[:, :-1])
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
            count += chunk.shape[1] - 1
    return math.exp(total / count)
