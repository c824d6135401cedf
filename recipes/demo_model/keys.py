"""Phase 5's data and checks: answer by key, copy the key, refuse at the key.

The phase-3 model recalled a lone fact but answered with "a recent code" whatever the key
(two codes held: right 0.40-0.44, the other 0.37-0.42), so it could not tell a
never-stated key from a stated one. Phase 5's blocks (plan.py, `KeyDrills`) drill keys:
`Builder.key_drill` rows state two to four codes and then ask all of them in shuffled
order, with never-stated keys among them; the later blocks mix in phase-3 rows and prose.
Why each choice was made, and what the experiments around it measured:
docs/recipe-experiments.md.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch

from recipes.demo_model import data as rdata
from recipes.demo_model.corpus import Passage
from recipes.demo_model.dialogues import Fact
from recipes.demo_model.plan import BATCH_TOKENS, KeyDrills
from recipes.demo_model.recall_eval import EVAL_SEED, evaluate
from recipes.demo_model.recall_eval import held_out_code
from recipes.demo_model.vocab import HELDOUT, composed
from recipes.demo_model.worlds import drill_world, phase2_world, phase3_world

KEYS = ("fragment", "real", "phase2")


def write_block(folder: Path, block: KeyDrills, *, seed: int, steps: int, lm: Any, train: list[Passage]) -> dict[str, Any]:
    """The data of `block` for `steps` steps, into `folder`: a_rows.jsonl (phase-3 rows),
    a_keys.jsonl (key drills), b_text.jsonl (wide prose), in the block's shares of
    `steps` x BATCH_TOKENS tokens; returns what it holds."""
    if block.keys not in KEYS:
        raise ValueError(f"unknown key words {block.keys!r}; expected one of {', '.join(KEYS)}")
    tok, template = lm.tokenizer, lm.template
    total = steps * BATCH_TOKENS
    rng = random.Random(seed)
    info: dict[str, Any] = {}
    shares, rows3, drill = block.shares, block.rows3, block.drill
    if shares[0] and rows3 is not None:
        b3 = rdata.make_builder(composed(phase3_world(train)), train, tok, template)
        info["phase3_tokens"] = rdata.write_dialogues(folder / "a_rows.jsonl", b3, rng, rows3, math.ceil(total * shares[0] / rows3.length * 1.05),
                                                      tok, template)
    if block.keys == "phase2":  # the first block: phase 2's world and plain phrasings
        world = phase2_world(train)
    elif block.keys == "fragment":
        world = drill_world(train, tok, rng)
    else:
        world = composed(phase3_world(train))
    bk = rdata.make_builder(world, train, tok, template)
    info["key_drill_tokens"] = rdata.write_dialogues(folder / "a_keys.jsonl", bk, rng, drill, math.ceil(total * shares[1] / drill.length * 1.05),
                                                     tok, template)
    if shares[2]:
        prose = rdata.prose(rng, train, total * shares[2] * 4)
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



def check(lm: Any, held: list[Passage], step: int, greedy: bool) -> dict[str, Any]:
    """The forced check, and with `greedy` a short greedy one (12 trials at distance 0)."""
    out: dict[str, Any] = {"step": step, **forced_check(lm)}
    if greedy:
        r = evaluate(lm, held, distances=(0,), trials=12, kinds=("recall", "never", "keys"))
        out.update(recall_5digit=r["recall_5digit"][0], refused_stated=r["refused_stated"][0], not_told=r["not_told"][0],
                   two_codes_right=r["keys_right"][0], two_codes_swapped=r["keys_swapped"][0])
    return out
