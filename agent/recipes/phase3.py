"""Phase 3 of the default model's recipe: "not told" when it was never said, and prose.

Phase 2 (`phase2.py`) ends with a model that recalls 5-digit codes at 256-512 tokens but
answers most never-stated questions at 256 with an invented value (0.17 "not told"), and
whose held-out text perplexity rose from 128 to 676: the ~180 k tokens of training
docstrings had been repeated until they were learned by heart (perplexity 1.3 on them).
Two causes, two changes, one block of rows of 512 tokens (questions 0-450 after the fact):

- Ghost questions (`DialogueSpec.ghost_prob`): every planted fact schedules a question
  about a key that is never stated, due after a gap drawn like the fact's own, and some
  of both are asked at once (`near_gap`). Before, never-stated questions came in free
  slots, so *when* a question came said which kind it was; now only the key does.
- Wide prose (`corpus.wide_text`): the pydoc topics and torch's docstrings join the
  training docstrings, about four times as much text, as 30% of the block's tokens.

A fresh optimizer, LR warmup then a WSD decay over the last half.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.recipes.corpus import wide_text
from agent.recipes.dialogues import DialogueSpec
from agent.recipes.phase2 import COMMON, fresh_block

LR = 4e-4
TEXT_SHARE = 0.3
SPEC = DialogueSpec(**{**COMMON, "length": 512, "gap_min": 0, "gap_max": 450, "max_live": 6, "never_prob": 0.03,
                       "ghost_prob": 1.0, "near_miss": 0.3, "near_gap": 0.3})


def calibrate(args: argparse.Namespace, start: Path) -> dict[str, Any]:
    """Train phase 3 from the model directory `start` into <work>/phase3; returns its
    history entry."""
    work, steps = Path(args.work), args.phase3_steps
    info, summary = fresh_block(args, start, label="phase 3", folder=work / "phase3_data", out=work / "phase3", spec=SPEC,
                                steps=steps, seed=args.seed + 4099, stage=300, lr=LR, warmup=20, decay_fraction=0.5,
                                text_share=TEXT_SHARE, text=wide_text)
    return {"phase": 3, "block": "ghosts+prose", "data": info, "steps": [0, steps], "lr": LR, "text_share": TEXT_SHARE,
            "tokens_per_s": summary["tokens_per_s"], "final_loss": summary["final_loss"], "wall_s": summary["wall_s"]}
