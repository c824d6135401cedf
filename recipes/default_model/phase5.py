"""Phase 5 of the default model's recipe: answer by key, copy the key, refuse at the key.

The phase-3 model recalls a lone fact but answers with "a recent code" whatever the key
(two codes held: right 0.40-0.44, the other 0.37-0.42), so it cannot tell a never-stated
key from a stated one. Measured on the way here (docs/default-model.md):

- Key matching is learned in ~450 steps of key drills once the loss is on a value's first
  digit alone; with the whole answer in the loss it had not appeared after 1,000 steps.
- The choice to refuse is easier right after the key is restated, so refusals here are
  key-local ("The pin for the X is something you haven't told me.", `Fact.not_told`).
- That only helps if the reply restates the asked key. Trained on a few thousand real
  words as keys, the model wrote a key from its own vocabulary of keys instead (0 of 40
  held-out keys copied exactly: "the pin for the porch closet" -> "the combination for the
  press flip"), then rightly refused the key it had written. Keys made of arbitrary BPE
  fragments (`fragment_words`) can only be copied, and 450 steps of them took held-out
  keys from 0 to 19-20 of 20 copied.
- Never-stated keys in the drills are unrelated to the stated ones (`far_ghosts`): with
  only one-word-off ghosts the choice stalled at an AUC of .66 (held out); a toy of the
  same shape separates unrelated keys at .998 and one-word-off keys at .64-.77.
- Statements and questions said in many more ways (`vocab.composed`): a model that copied
  held-out keys still refused 10 of 30 stated codes said as "I set ... to {value}".

Blocks from the model directory `start`, each its own data and WSD schedule (lr 1e-3):

- "bind" (rows of 256): phase 2's key drills, the loss on the values' first digits only
  (`FocusTrainer`, focus "digit", focus_only), the measured first-digit-only run's setting;
- "decide" (rows of 512): key drills (phase 3's words, or fragment words), one to three
  unrelated never-stated keys per block, an update in 30% of the blocks, key-local
  refusals, the loss on the copied key, the token after "is" and the first digit only;
- "mix" (rows of 512): 40% phase-3 rows (composed phrasings, key-local refusals, ghosts
  beside 30% of facts), 40% key drills of fragment words, 20% wide prose; answers x4 and
  those decision tokens x8;
- "long" (rows of 1,024): as "mix", with twice phase 3's updates in its rows and the
  user's own details beside codes in the drills, half of whose blocks hold an update;
- "details" (rows of 1,024, off): as "long", with as many details again named with
  made-up words (`drill_world(..., slots=True)`);
- "gaps" (rows of 1,024, off): as "long", with 64-600 tokens of unrelated chat between a
  drill block's statements and its questions;
- "far" (rows of 1,024, off): more phase-3 rows, ghosts beside 60% of facts, three times
  the updates, details of made-up words;
- "wide" (rows of 1,024, off): the heads widened to 64 x 64 (`widen.py`, same outputs),
  then fresh data of the "long" block.

Measured (96 held-out trials each, docs/default-model.md, "Phase 5 in the recipe"): 450 /
1,200 (phase 3's words) / 700 / 1,000 steps on the phase-3 model is the shipped model; at
256 tokens 5-digit recall .96 (phase 3: .85), "not told" .64 (.53), stale .23 (.25), two
codes right .70 (.40). The first run, 450 / 450 (fragment words) / 700 steps and no long
block, bound keys as well but refused less ("not told" .49) and lost recall past 512;
"far" after "long" raised "not told" to .70 but refused .20 of stated facts and lost
recall at 1,024 (.79 -> .60); "gaps" after "long" was worse on every measure ("not told"
.55, stale .29); "details" matched codes better (two codes right .79) but refused less
("not told" .50, stale .27); "wide" after "long" (1,200 steps) was worse on the floors
("not told" .59, stale .29, perplexity 113.1 against 103.2).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch

from agent.probes import text as probe_text
from recipes.default_model import data as rdata
from recipes.default_model.build_default import ANSWER_WEIGHT, BATCH_TOKENS, log, log_progress
from recipes.default_model.corpus import Passage
from recipes.default_model.dialogues import DialogueSpec, Fact
from recipes.default_model.phase2 import phase2_world
from recipes.default_model.phase3 import SPEC as PHASE3_SPEC
from recipes.default_model.phase3 import phase3_world
from recipes.default_model.phase4 import _prose, start_block
from recipes.default_model.recall_eval import EVAL_SEED, evaluate
from recipes.default_model.recall_eval import _code as held_out_code
from recipes.default_model.vocab import HELDOUT, World, composed
from recipes.default_model.weighted import FocusTrainer
from recipes.default_model.widen import widen_heads
from agent.runtime.checkpoint import load_model_dir, save_model_dir
from agent.runtime.tokenizer import Tokenizer
from agent.train.config import TrainConfig

LR = 1e-3
FOCUS_WEIGHT = 8.0
CHECK_EVERY = 250
DECAY = 0.25  # share of each block's steps spent in the WSD decay
FRAGMENT_WORDS = 20_000  # thing adjectives and nouns each, for the drills
BIND = DialogueSpec(length=256, gap_min=0, gap_max=0, key_drill=True)  # the measured first-digit-only run's rows
DRILL = DialogueSpec(length=512, gap_min=0, gap_max=0, key_drill=True, key_local=True, drill_ghosts=(1, 3), far_ghosts=1.0,
                     drill_updates=0.3)
ROWS3 = dataclasses.replace(PHASE3_SPEC, key_local=True, ghost_prob=0.3, near_gap=0.0)
MIX = (0.4, 0.4, 0.2)  # phase-3 rows, key drills, prose
# The "long" block: rows twice as long (recall past 512 fell in the 512-row blocks), twice
# phase 3's updates, and drills whose facts are also the user's own details (a model
# drilled on codes alone refused 22 of 26 never-stated codes but 5 of 14 never-stated
# details, held out, 40 trials).
LONG_ROWS3 = dataclasses.replace(ROWS3, length=1024, gap_max=900, update_prob=0.16)
LONG_DRILL = dataclasses.replace(DRILL, length=1024, drill_slots=0.4, drill_updates=0.5)
# The "far" block, after "long": never-stated and updated facts asked at a distance. After
# "long", a never-stated code asked 256 tokens after another code got that code 12 times
# in 20 (held out); the drills ask right after the statements, and phase-3 rows (the only
# questions at a distance) had a ghost beside 30% of facts. Here: rows of 1,024, more of
# them phase-3 rows, a ghost beside 60% of facts, updates three times phase 3's rate, and
# details of made-up words too.
FAR_ROWS3 = dataclasses.replace(LONG_ROWS3, ghost_prob=0.6, update_prob=0.24)
FAR_DRILL = dataclasses.replace(LONG_DRILL, drill_slots=0.5)
FAR_MIX = (0.5, 0.35, 0.15)
# The "gaps" block, after "long" instead of "far": the same data as "long", but the
# drills put 64-600 tokens of unrelated chat between a block's statements and its
# questions, so that keys are told apart (and refusals decided) at a distance with the
# drills' dense decision tokens, not only in the sparser phase-3 rows.
GAPS_DRILL = dataclasses.replace(LONG_DRILL, drill_gap=(64, 600))
DECISION = ("digit", "decision", "key")


class Block(NamedTuple):
    """One block of phase 5: its loss (focus tokens, and whether only they count), its
    shares of phase-3 rows, key drills and prose, their specs, and whether the drills'
    world adds details named with made-up words. Its rows are its drills' length."""

    focus: tuple[str, ...]
    focus_only: bool
    shares: tuple[float, float, float] = MIX
    rows3: DialogueSpec = ROWS3
    drill: DialogueSpec = DRILL
    made_up_details: bool = False

    @property
    def rows(self) -> int:
        return self.drill.length


LONG = Block(DECISION, False, rows3=LONG_ROWS3, drill=LONG_DRILL)
BLOCKS: dict[str, Block] = {
    "bind": Block(("digit",), True, shares=(0.0, 1.0, 0.0), drill=BIND),
    "decide": Block(DECISION, True, shares=(0.0, 1.0, 0.0)),
    "mix": Block(DECISION, False),
    "long": LONG,
    "details": LONG._replace(made_up_details=True),
    "gaps": LONG._replace(drill=GAPS_DRILL),
    "far": Block(DECISION, False, shares=FAR_MIX, rows3=FAR_ROWS3, drill=FAR_DRILL, made_up_details=True),
    "wide": LONG,  # long's data; copy_keys widens the heads first
}
# The "wide" block (off): the model's heads widened (widen.py) from 32 x 32 to WIDE_HEADS,
# then trained on fresh data of the "long" block. The blocks tried after "long" on 32 x 32
# heads each lost more than they gained; a bigger state per head was the other lever. It
# did not move the refusal choice (forced AUC .72 after 1,200 steps, as before).
WIDE_HEADS = (64, 64)
KEYS = ("fragment", "real")  # the decide block's key words: made-up word pieces, or phase 3's words
BANNED = frozenset((*HELDOUT.thing_adj, *HELDOUT.thing_noun, *probe_text.ADJECTIVES, *probe_text.NOUNS, "is", "for", "the"))


def fragment_words(tok: Tokenizer, rng: random.Random, n: int) -> tuple[str, ...]:
    """`n` made-up words, each one of the tokenizer's word-start pieces (" por") and zero to
    three inner pieces ("ch", "set"): a key no training word is, so a reply can only name
    it by copying. No held-out or probe-suite word, and never " is" / " for" / " the". A
    tokenizer without word pieces (byte-level) gets words of 2-9 random letters."""
    pieces = [tok.decode([i]) for i in range(tok.vocab_size)]
    lead = [p for p in pieces if re.fullmatch(r" [a-z]{1,8}", p) and p.strip() not in BANNED]
    inner = [p for p in pieces if re.fullmatch(r"[a-z]{1,6}", p)]
    inner_counts: tuple[int, ...] = (0, 1, 1, 2, 2, 3)
    if not lead or not inner:
        letters = "abcdefghijklmnopqrstuvwxyz"
        lead, inner, inner_counts = [" " + c for c in letters], list(letters), tuple(range(1, 9))
    out: list[str] = []
    while len(out) < n:
        w = (rng.choice(lead) + "".join(rng.choice(inner) for _ in range(rng.choice(inner_counts)))).strip()
        if w not in BANNED and 2 <= len(w) <= 14:
            out.append(w)
    return tuple(out)


def drill_world(train: list[Passage], tok: Tokenizer, rng: random.Random, slots: bool = False) -> World:
    """Phase 3's world, composed phrasings, keys of fragment words; the training attributes
    ("pin", "code", ...) three times as often as fragment ones. With `slots`, as many
    details again of fragment words ("my porchset number", "my orlin's name", "my favorite
    stog"), since a held-out detail's words are new too ("Your favorite fixed's name is ..."
    for "my favorite fruit")."""
    w = composed(phase3_world(train))
    attrs = phase2_world(train).code_attrs
    w = dataclasses.replace(w, thing_adj=fragment_words(tok, rng, FRAGMENT_WORDS), thing_noun=fragment_words(tok, rng, FRAGMENT_WORDS),
                            code_attrs=attrs * 3 + fragment_words(tok, rng, len(attrs)))
    if not slots:
        return w
    shapes = (("{} number", "num3"), ("{} number", "num5"), ("{}'s name", "person"), ("favorite {}", "fruit"), ("favorite {}", "place"),
              ("{} day", "date"), ("{} code", "num4"))
    made = ((shapes[i % len(shapes)][0].format(word), shapes[i % len(shapes)][1])
            for i, word in enumerate(fragment_words(tok, rng, len(w.slots))))
    held_out = {slot for slot, _ in HELDOUT.slots}
    return dataclasses.replace(w, slots=w.slots + tuple(m for m in made if m[0] not in held_out))


def write_block(folder: Path, name: str, *, seed: int, steps: int, lm: Any, train: list[Passage], keys: str = "fragment") -> dict[str, Any]:
    """The data of block `name` (a key of BLOCKS) for `steps` steps, into `folder`; the
    drills' things are `keys` words (KEYS)."""
    if keys not in KEYS:
        raise ValueError(f"unknown key words {keys!r}; expected one of {', '.join(KEYS)}")
    tok, template = lm.tokenizer, lm.template
    total = steps * BATCH_TOKENS
    rng = random.Random(seed)
    info: dict[str, Any] = {"block": name}
    block = BLOCKS[name]
    shares, rows3, drill = block.shares, block.rows3, block.drill
    if name == "bind":  # phase 2's world: the measured first-digit-only run's drills
        b = rdata.make_builder(phase2_world(train), train, tok, template)
        info["key_drill_tokens"] = rdata.write_dialogues(folder / "a_keys.jsonl", b, rng, drill, math.ceil(total / drill.length * 1.05),
                                                         tok, template)
        return info
    if shares[0]:
        b3 = rdata.make_builder(composed(phase3_world(train)), train, tok, template)
        info["phase3_tokens"] = rdata.write_dialogues(folder / "a_rows.jsonl", b3, rng, rows3, math.ceil(total * shares[0] / rows3.length * 1.05),
                                                      tok, template)
    world = drill_world(train, tok, rng, slots=block.made_up_details) if keys == "fragment" else composed(phase3_world(train))
    bk = rdata.make_builder(world, train, tok, template)
    info["key_drill_tokens"] = rdata.write_dialogues(folder / "a_keys.jsonl", bk, rng, drill, math.ceil(total * shares[1] / drill.length * 1.05),
                                                     tok, template)
    if shares[2]:
        prose = _prose(rng, train, total * shares[2] * 4)
        rdata.write_text(folder / "b_text.jsonl", prose)
        info["prose_chars"] = sum(len(p.text) for p in prose)
    return info


@torch.inference_mode()
def forced_check(lm: Any, trials: int = 40) -> dict[str, float]:
    """Two held-out codes (different first digits) stated, then each asked, and a third,
    never-stated one, with the reply forced up to "The {attr} for the {thing} is". Reads
    the next-token probabilities: binding is P(" " then the asked code's first digit)
    against the other code's; the choice is the AUC of P(" something") (the key-local
    refusal) for never-stated over stated codes. Greedy checks say nothing while a block
    trains the decision tokens alone (its replies are not fluent); these still do."""
    lm.model.eval()
    tok, template = lm.tokenizer, lm.template
    some, space = tok.encode(" something")[0], tok.encode(" ")[-1]
    sys_ids = template.message(tok, "system", "", first=True)
    right = other = wins = 0.0
    stated_p: list[float] = []
    never_p: list[float] = []
    for t in range(trials):
        rng = random.Random(EVAL_SEED + 17 * t)
        facts: list[Fact] = []
        while len(facts) < 3:
            f = held_out_code(rng)
            if all(f.thing != g.thing and f.value[0] != g.value[0] for g in facts):
                facts.append(f)
        ids = list(sys_ids)
        for f in facts[:2]:
            ids += template.message(tok, "user", f.statement(rng, HELDOUT)) + template.message(tok, "assistant", rng.choice(HELDOUT.acks))
        for k, f in enumerate(facts):
            q = (ids + template.message(tok, "user", f.question(rng, HELDOUT)) + template.reply_prefix(tok)
                 + tok.encode(f"The {f.attr} for the {f.thing} is"))
            logits, state = lm.model(torch.tensor([q]), last_only=True)
            (never_p if k == 2 else stated_p).append(float(logits[0, -1].softmax(-1)[some]))
            if k < 2:
                nxt, _ = lm.model(torch.tensor([[space]]), state)
                p = nxt[0, -1].softmax(-1)
                a, o = p[tok.encode(f.value[0])[0]], p[tok.encode(facts[1 - k].value[0])[0]]
                right, other, wins = right + float(a), other + float(o), wins + float(a > o)
    auc = sum((n > s_) + 0.5 * (n == s_) for n in never_p for s_ in stated_p) / (len(never_p) * len(stated_p))
    return {"bind_right": round(right / (2 * trials), 3), "bind_other": round(other / (2 * trials), 3),
            "bind_right_wins": round(wins / (2 * trials), 3), "refusal_auc": round(auc, 3)}


def _check(lm: Any, held: list[Passage], step: int, greedy: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, **forced_check(lm)}
    if greedy:
        r = evaluate(lm, held, distances=(0,), trials=12, kinds=("recall", "never", "keys"))
        out.update(recall_5digit=r["recall_5digit"][0], refused_stated=r["refused_stated"][0], not_told=r["not_told"][0],
                   two_codes_right=r["keys_right"][0], two_codes_swapped=r["keys_swapped"][0])
    return out


def train_block(args: argparse.Namespace, start: Path, name: str, steps: int, seed: int, keys: str = "fragment") -> dict[str, Any]:
    """Train block `name` from the model directory `start` into <work>/phase5_<name>."""
    train_p, held_p, base, folder, run = start_block(args, start, f"phase5_{name}")
    info = {**write_block(folder, name, seed=seed, steps=steps, lm=base, train=train_p, keys=keys), "keys": keys}
    block = BLOCKS[name]
    rows, focus, only = block.rows, block.focus, block.focus_only
    log(f"phase 5 {name} from {start}: {steps} steps; {info}; forced {forced_check(base)}")
    checks, summaries = [], []
    for end in [*range(CHECK_EVERY, steps, CHECK_EVERY), steps]:
        cfg = TrainConfig(data=(str(folder),), out=str(run), base=str(start), steps=steps, seq_len=rows, batch_tokens=BATCH_TOKENS,
                          lr=LR, warmup=20, schedule="wsd", decay_fraction=DECAY, resume=str(run) if checks else None,
                          stop_after=end, seed=args.seed, device="cpu")
        summaries.append(FocusTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=ANSWER_WEIGHT,
                                      focus=focus, focus_weight=FOCUS_WEIGHT, focus_only=only).run())
        checks.append(_check(load_model_dir(run), held_p, end, greedy=not only))
        log(f"phase 5 {name} after step {end}: {checks[-1]}")
    shutil.rmtree(folder)  # rebuilt from the seed if ever needed
    tps = [s["tokens_per_s"] for s in summaries]
    return {"phase": 5, "block": name, "data": info, "steps": [0, steps], "rows": rows, "focus": list(focus), "focus_only": only,
            "lr": LR, "checks": checks, "tokens_per_s": round(sum(tps) / len(tps)), "final_loss": summaries[-1]["final_loss"],
            "wall_s": sum(s["wall_s"] for s in summaries)}


def widen_dir(start: Path, out: Path, seed: int) -> Path:
    """The model at `start` with WIDE_HEADS heads (same logits), saved to `out`."""
    lm = widen_heads(load_model_dir(start), *WIDE_HEADS, seed=seed)
    save_model_dir(lm, out, card=lm.card)
    log(f"phase 5: widened heads of {start} to {WIDE_HEADS[0]} x {WIDE_HEADS[1]} in {out} ({lm.config.parameters():,} parameters)")
    return out


def copy_keys(args: argparse.Namespace, start: Path) -> tuple[list[dict[str, Any]], Path]:
    """Phase 5 from the model directory `start`: the bind, decide, mix, long, details, gaps,
    far and wide blocks for `args.phase5_bind_steps`, `args.phase5_decide_steps` (its key
    words: `args.phase5_decide_keys`), `args.phase5_steps`, `args.phase5_long_steps`,
    `args.phase5_details_steps`, `args.phase5_gaps_steps`, `args.phase5_far_steps` and
    `args.phase5_wide_steps` (a block with 0 steps is skipped; "wide" first widens the
    heads). Returns the blocks' history entries and the directory of the last block's model."""
    entries = []
    for name, steps, seed in (("bind", args.phase5_bind_steps, 7373), ("decide", args.phase5_decide_steps, 7979),
                              ("mix", args.phase5_steps, 8484), ("long", args.phase5_long_steps, 9191),
                              ("details", args.phase5_details_steps, 9595), ("gaps", args.phase5_gaps_steps, 9393),
                              ("far", args.phase5_far_steps, 9797), ("wide", args.phase5_wide_steps, 6161)):
        if steps:
            keys = args.phase5_decide_keys if name == "decide" else "fragment"
            if name == "wide":
                start = widen_dir(start, Path(args.work) / "phase5_widened", seed=args.seed)
            entries.append(train_block(args, start, name, steps, seed=args.seed + seed, keys=keys))
            start = Path(args.work) / f"phase5_{name}"
    return entries, start
