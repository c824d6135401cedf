"""Phase 4 of the default model's recipe (experimental, not shipped): recall by key.

The phase-3 model meets the single-fact recall floors, but a new measurement
(`recall_eval`'s "keys": two codes held, each asked) shows why it fails "not told": with
two codes held it gives the right one 0.40-0.44 of the time and the other 0.37-0.42, i.e. it
answers with a recent code whatever the key. Asked for a code never stated while another
code is held, it gave the held code (0.03 "not told" in that case, 30 trials). Matching
the key is the missing skill; `lookup.py` is its plainest form.

Three blocks, each with its own data and WSD schedule, lr 1e-3, answers weighted x4:

- "lookup" (rows of 256): 40% key drill rows (`Builder.key_drill`: 2-4 codes, then all
  asked in shuffled order, with one-word-off ghosts), 50% the plain-text lookup task, 10%
  wide prose;
- "mix" (rows of 512): 45% phase-3 rows (long gaps, ghosts, updates, slots, documents),
  20% key drill rows, 25% lookup task, 10% prose; made for MIX_PLAN times its steps;
- "bridge" (rows of 512): as "mix" with 40 / 20 / 30 / 10, and lookup records in three
  styles, the last two closer to a chat answer (`lookup.record`).

Each is trained in stops (every CHECK_EVERY steps; a resume is the same run), logging
the lookup task's first-digit accuracy and the two-codes check. Measured (900 + 500 +
1,000 steps from the phase-3 model): the lookup task went from chance (0.09) to 0.40 (and
stayed there for 1,400 more steps of the lookup block's data), but chat recall still took
the latest code (two codes right 0.43-0.48), "not told" and stale
updates got worse, and recall at 512 and text perplexity got better; so the shipped model
is still phase 3's. Numbers: docs/default-model.md.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from recipes.default_model import data as rdata
from recipes.default_model import lookup
from recipes.default_model.build_default import ANSWER_WEIGHT, BATCH_TOKENS, log, log_progress
from recipes.default_model.corpus import Passage, read_passages, split_passages, wide_text
from recipes.default_model.dialogues import DialogueSpec
from recipes.default_model.phase2 import phase2_world
from recipes.default_model.phase3 import SPEC as PHASE3_SPEC
from recipes.default_model.phase3 import phase3_world
from recipes.default_model.recall_eval import evaluate
from recipes.default_model.weighted import WeightedTrainer
from agent.runtime.checkpoint import load_model_dir
from agent.train.config import TrainConfig

LR = 1e-3
CHECK_EVERY = {"lookup": 300, "mix": 500, "bridge": 500}
DECAY = {"lookup": 0.2, "mix": 0.3, "bridge": 0.3}  # share of each block's plan spent in the WSD decay
# The mix block's data and schedule are made for three times the steps it trains: the run
# made stopped it there (still at full LR) for the bridge block, once the lookup task was
# being learned (first digit 0.40) but chat recall still took the latest code.
MIX_PLAN = 3
CHARS_PER_LOOKUP_TOKEN = 2.2  # measured on lookup.record with the default tokenizer


def _prose(rng: random.Random, train: list[Passage], chars: float) -> list[Passage]:
    pool = wide_text(train)
    rng.shuffle(pool)
    return rdata.take_chars(pool, chars)[0]


def _lookup_records(rng: random.Random, words: list[str], chars: float, styles: tuple[str, ...] = ("word",)) -> list[Passage]:
    out, n = [], 0
    while n < chars:
        r = lookup.record(rng, words, style=styles[len(out) % len(styles)])
        out.append(Passage("lookup", "lookup", r))
        n += len(r)
    return out


def write_block(folder: Path, name: str, *, seed: int, steps: int, lm: Any, train: list[Passage]) -> dict[str, Any]:
    """The data of block `name` ("lookup", "mix" or "bridge") for `steps` steps, into
    `folder`; returns what it holds."""
    tok, template = lm.tokenizer, lm.template
    words = lookup.key_words(tok)
    total = steps * BATCH_TOKENS
    rng = random.Random(seed)
    info: dict[str, Any] = {"block": name, "key_words": len(words)}
    if name == "lookup":
        n = math.ceil(total * 0.4 / 256 * 1.1)
        b = rdata.make_builder(phase2_world(train), train, tok, template)
        info["key_drill_tokens"] = rdata.write_dialogues(folder / "a_dialogues.jsonl", b, rng,
                                                         DialogueSpec(length=256, gap_min=0, gap_max=0, key_drill=True), n, tok, template)
        records = _lookup_records(rng, words, total * 0.5 * CHARS_PER_LOOKUP_TOKEN * 1.1)
    else:
        shares = {"mix": (0.45, 0.2, 0.25), "bridge": (0.4, 0.2, 0.3)}[name]
        b3 = rdata.make_builder(phase3_world(train), train, tok, template)
        n3 = math.ceil(total * shares[0] / 512 * 1.05)
        info["phase3_tokens"] = rdata.write_dialogues(folder / "a_dialogues.jsonl", b3, rng, PHASE3_SPEC, n3, tok, template)
        bk = rdata.make_builder(phase2_world(train), train, tok, template)
        nk = math.ceil(total * shares[1] / 512 * 1.05)
        info["key_drill_tokens"] = rdata.write_dialogues(folder / "a_keys.jsonl", bk, rng,
                                                         DialogueSpec(length=512, gap_min=0, gap_max=0, key_drill=True), nk, tok, template)
        records = _lookup_records(rng, words, total * shares[2] * CHARS_PER_LOOKUP_TOKEN * 1.05,
                                  ("word",) if name == "mix" else ("word", "is", "pair"))
    prose = _prose(rng, train, total * 0.1 * 4)
    text = records + prose
    rng.shuffle(text)
    rdata.write_text(folder / "b_text.jsonl", text)
    info.update(lookup_records=len(records), prose_chars=sum(len(p.text) for p in prose))
    return info


def start_block(args: argparse.Namespace, start: Path, block: str) -> tuple[list[Passage], list[Passage], Any, Path, Path]:
    """(training passages, held-out passages, the model at `start`, an empty data folder,
    an empty run folder) for the block named `block` ("phase4_mix", ...) under --work."""
    torch.set_num_threads(args.threads)
    train_p, held_p = split_passages(read_passages())
    folder, run = Path(args.work) / f"{block}_data", Path(args.work) / block
    for d in (folder, run):
        if d.exists():
            shutil.rmtree(d)
    return train_p, held_p, load_model_dir(start), folder, run


def train_block(args: argparse.Namespace, start: Path, name: str, steps: int, seed: int, plan: int | None = None) -> dict[str, Any]:
    """Train block `name` from the model directory `start` into <work>/phase4_<name>: data and
    WSD schedule made for `plan` steps (default `steps`), stopped after `steps`."""
    train_p, held_p, base, folder, run = start_block(args, start, f"phase4_{name}")
    plan = plan or steps
    info = write_block(folder, name, seed=seed, steps=plan, lm=base, train=train_p)
    words = lookup.key_words(base.tokenizer)
    log(f"phase 4 {name} from {start}: {steps} of {plan} steps; {info}; lookup first digit {lookup.first_digit_accuracy(base, words):.2f}")
    checks, summaries = [], []
    every = CHECK_EVERY[name]
    for end in [*range(every, steps, every), steps]:
        cfg = TrainConfig(data=(str(folder),), out=str(run), base=str(start), steps=plan, seq_len=256 if name == "lookup" else 512,
                          batch_tokens=BATCH_TOKENS, lr=LR, warmup=20, schedule="wsd", decay_fraction=DECAY[name],
                          resume=str(run) if checks else None, stop_after=end, seed=args.seed, device="cpu")
        summaries.append(WeightedTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=ANSWER_WEIGHT).run())
        lm = load_model_dir(run)
        keys = evaluate(lm, held_p, distances=(0,), trials=24, kinds=("keys",))
        checks.append({"step": end, "lookup_first_digit": lookup.first_digit_accuracy(lm, words),
                       "two_codes_right": keys["keys_right"][0], "two_codes_swapped": keys["keys_swapped"][0]})
        log(f"phase 4 {name} after step {end}: {checks[-1]}")
    shutil.rmtree(folder)  # rebuilt from the seed if ever needed
    tps = [s["tokens_per_s"] for s in summaries]
    return {"phase": 4, "block": name, "data": info, "steps": [0, steps], "planned_steps": plan, "lr": LR, "checks": checks,
            "tokens_per_s": round(sum(tps) / len(tps)), "final_loss": summaries[-1]["final_loss"],
            "wall_s": sum(s["wall_s"] for s in summaries)}


def match_keys(args: argparse.Namespace, start: Path) -> list[dict[str, Any]]:
    """Phase 4 from the model directory `start` (a phase-3 output): the lookup block for
    `args.phase4_lookup_steps`, the mix block for `args.phase4_mix_steps` (of a plan
    MIX_PLAN times as long), then the bridge block for `args.phase4_steps`, whose model is
    left in <work>/phase4_bridge. A block with 0 steps is skipped. Returns the blocks'
    history entries."""
    entries = []
    for name, steps, seed, plan in (("lookup", args.phase4_lookup_steps, 4242, None),
                                    ("mix", args.phase4_mix_steps, 5151, MIX_PLAN * args.phase4_mix_steps),
                                    ("bridge", args.phase4_steps, 6262, None)):
        if steps:
            entries.append(train_block(args, start, name, steps, seed=args.seed + seed, plan=plan))
            start = Path(args.work) / f"phase4_{name}"
    return entries
