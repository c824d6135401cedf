"""Phase 3 of the default model's recipe: "not told" when it was never said, and prose.

Phase 2 (`phase2.py`) ends with a model that recalls 5-digit codes at 256-512 tokens but
answers most never-stated questions at 256 with an invented value (0.17 "not told"), and
whose held-out text perplexity rose from 128 to 676: the ~180 k tokens of training
docstrings had been repeated until they were learned by heart (perplexity 1.3 on them).
One block of rows of 512 tokens (questions 0-450 after the fact) changes three things:

- Ghost questions (`DialogueSpec.ghost_prob`): a planted fact schedules a question about
  a key that is never stated, due after a gap drawn like the fact's own, and some of both
  are asked at once (`near_gap`). Before, never-stated questions came in free slots, so
  *when* a question came said which kind it was; now only the key does.
- Wide prose (`corpus.wide_text`): the pydoc topics and torch's docstrings join the
  training docstrings, about four times as much text. TEXT_SHARE asks for 30% of the
  block's tokens; at 1,500 steps that is more than the pool, so all of it is read once
  (measured: 0.94 M of 5.67 M tokens).
- Twice as many phrasings (`vocab.varied`): with TRAIN's six statement shapes, the model
  did not take a held-out "I set the pin for the roof scanner to 22730." as a fact.

A fresh optimizer, LR warmup then a WSD decay over the last half. Measured from the
phase-2 model with the first two changes only (ghosts beside every fact, 1,800 steps):
"not told" 0.79 at 256 and 512, perplexity 164, but stated facts refused 0.25 / 0.33 and
5-digit recall 0.62 / 0.54; hence ghosts beside 70% of facts and the new phrasings. With
all three (1,500 steps, the shipped model; 96 held-out trials): "not told" 0.53 at 256
(phase 2: 0.22) with 0.11 of stated facts refused, 5-digit recall 0.85 / 0.65 at 256 / 512,
stale 0.25, perplexity 162 on the held-out docstrings (phase 2: 842).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recipes.default_model.corpus import Passage, wide_text
from recipes.default_model.dialogues import DialogueSpec
from recipes.default_model.phase2 import COMMON, fresh_block, phase2_world
from recipes.default_model.vocab import World, varied

LR = 4e-4
TEXT_SHARE = 0.3
SPEC = DialogueSpec(**{**COMMON, "length": 512, "gap_min": 0, "gap_max": 450, "max_live": 6, "never_prob": 0.03,
                       "ghost_prob": 0.7, "near_miss": 0.3, "near_gap": 0.3})


def phase3_world(train: list[Passage]) -> World:
    """Phase 2's widened world, said in twice as many ways (`vocab.varied`)."""
    return varied(phase2_world(train))


def calibrate(args: argparse.Namespace, start: Path) -> dict[str, Any]:
    """Train phase 3 from the model directory `start` into <work>/phase3; returns its
    history entry."""
    work, steps = Path(args.work), args.phase3_steps
    info, summary = fresh_block(args, start, label="phase 3", folder=work / "phase3_data", out=work / "phase3", spec=SPEC,
                                steps=steps, seed=args.seed + 4099, stage=300, lr=LR, warmup=20, decay_fraction=0.5,
                                text_share=TEXT_SHARE, text=wide_text, world=phase3_world)
    return {"phase": 3, "block": "ghosts+prose", "data": info, "steps": [0, steps], "lr": LR, "text_share": TEXT_SHARE,
            "tokens_per_s": summary["tokens_per_s"], "final_loss": summary["final_loss"], "wall_s": summary["wall_s"]}
