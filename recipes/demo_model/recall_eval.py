"""Held-out chat evaluation of recall: what the model says, read greedily, in its own format.

Everything here is drawn from the HELDOUT world (other names, keys, statement and question
phrasings, other small talk) and the held-out docstring modules, with a seed the training
data never uses. Per distance d (tokens of unrelated chat between the fact and the
question) it measures:
- recall: the reply contains the planted value verbatim (5-digit codes and slot values);
- refusal of stated facts: the reply says "haven't told" although the fact was stated;
- not told: a never-stated question gets "haven't told";
- update: the reply holds the new value (correct) or the superseded one (stale);
- keys: two codes held at once, each asked: the reply holds the asked code (right) or the
  other one (swapped). A model that answers with "the latest code" instead of matching the
  key gets about half right here however well it recalls a lone fact;
- end of turn: every reply ends with <|end|> within 200 tokens.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import torch

from agent.probes.engine import advance
from recipes.demo_model.corpus import Passage
from recipes.demo_model.data import make_builder
from recipes.demo_model.dialogues import Builder, Fact, new_fact
from recipes.demo_model.vocab import HELDOUT
from agent.runtime.checkpoint import LoadedModel
from agent.runtime.state import RecurrentState

EVAL_SEED = 918_273  # never used by the training data


@torch.inference_mode()
def greedy(lm: LoadedModel, state: RecurrentState, prompt: list[int], max_new: int) -> tuple[str, bool]:
    """(reply text, ended with <|end|>) for `prompt` read on top of `state` (unchanged)."""
    model = lm.model
    stop = set(lm.template.stop_ids(lm.tokenizer))
    logits, st = model(torch.tensor([prompt]), state, last_only=True)
    logits = logits[0, -1]
    out: list[int] = []
    for _ in range(max_new):
        t = int(logits.argmax())
        if t in stop:
            return lm.tokenizer.decode(out), True
        out.append(t)
        step, st = model(torch.tensor([[t]]), st)
        logits = step[0, -1]
    return lm.tokenizer.decode(out), False


def _msg(lm: LoadedModel, role: str, content: str, first: bool = False) -> list[int]:
    return lm.template.message(lm.tokenizer, role, content, first=first)


def _filler(lm: LoadedModel, b: Builder, rng: random.Random, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        for m in b.filler(rng):
            ids += _msg(lm, m["role"], m["content"])
    return ids


def _ask(lm: LoadedModel, state: RecurrentState, f: Fact, rng: random.Random, max_new: int = 40) -> tuple[str, bool]:
    q = _msg(lm, "user", f.question(rng, HELDOUT)) + lm.template.reply_prefix(lm.tokenizer)
    return greedy(lm, state, q, max_new)


def _sweep(lm: LoadedModel, b: Any, rng: random.Random, plant: list[int], facts: list[Fact],
           distances: tuple[int, ...]) -> Iterator[tuple[int, Fact, str, bool]]:
    """Fold `plant`, then one stream of filler, asking about each of `facts` at every
    distance: (distance, fact, reply, ended its turn), one pass for the whole sweep."""
    _, state = advance(lm.model, lm.model.new_state(1), plant)
    fill = _filler(lm, b, rng, max(distances))
    pos = 0
    for d in distances:
        if d > pos:
            _, state = advance(lm.model, state, fill[pos:d])
            pos = d
        for f in facts:
            reply, ended = _ask(lm, state, f, rng)
            yield d, f, reply, ended


def held_out_code(rng: random.Random) -> Fact:
    """A held-out 5-digit code for a held-out thing."""
    return Fact("code", rng.choice(HELDOUT.code_attrs), f"{rng.choice(HELDOUT.thing_adj)} {rng.choice(HELDOUT.thing_noun)}",
                "num5", str(rng.randint(10000, 99999)))


def _refused(reply: str) -> bool:
    return "haven't told" in reply or "not told" in reply


def evaluate(lm: LoadedModel, passages: list[Passage], *, distances: tuple[int, ...] = (0, 64, 128, 256, 512, 1024, 2048),
             trials: int = 24, seed: int = EVAL_SEED, kinds: tuple[str, ...] = ("recall", "never", "update", "keys"),
             codes_only: bool = False) -> dict[str, Any]:
    lm.model.eval()
    b = make_builder(HELDOUT, passages, lm.tokenizer, lm.template)
    out: dict[str, Any] = {"distances": list(distances), "trials": trials}
    ends = total_replies = 0
    sys_ids = _msg(lm, "system", "", first=True)
    if "recall" in kinds:
        hit = {d: 0 for d in distances}
        code_hit = {d: 0 for d in distances}
        code_n = {d: 0 for d in distances}
        refused = {d: 0 for d in distances}
        for t in range(trials):
            rng = random.Random(seed * 31 + t)
            f = new_fact(rng, HELDOUT, set())
            if codes_only or t % 2 == 0:  # half are 5-digit codes: the headline number
                f = held_out_code(rng)
            plant = sys_ids + _msg(lm, "user", f.statement(rng, HELDOUT)) + _msg(lm, "assistant", rng.choice(HELDOUT.acks))
            for d, _, reply, ended in _sweep(lm, b, rng, plant, [f], distances):
                total_replies += 1
                ends += ended
                hit[d] += f.value in reply
                refused[d] += _refused(reply)
                if f.value_kind == "num5":
                    code_n[d] += 1
                    code_hit[d] += f.value in reply
        out["recall"] = {d: hit[d] / trials for d in distances}
        out["recall_5digit"] = {d: code_hit[d] / max(1, code_n[d]) for d in distances}
        out["refused_stated"] = {d: refused[d] / trials for d in distances}
    if "never" in kinds:
        told = {d: 0 for d in distances}
        for t in range(trials):
            rng = random.Random(seed * 37 + t)
            other = new_fact(rng, HELDOUT, set())
            f = new_fact(rng, HELDOUT, {other.key})
            plant = sys_ids + _msg(lm, "user", other.statement(rng, HELDOUT)) + _msg(lm, "assistant", rng.choice(HELDOUT.acks))
            for d, _, reply, ended in _sweep(lm, b, rng, plant, [f], distances):
                total_replies += 1
                ends += ended
                told[d] += _refused(reply)
        out["not_told"] = {d: told[d] / trials for d in distances}
    if "update" in kinds:
        new = {d: 0 for d in distances}
        stale = {d: 0 for d in distances}
        for t in range(trials):
            rng = random.Random(seed * 41 + t)
            f = held_out_code(rng)
            old = f.value
            ids = sys_ids + _msg(lm, "user", f.statement(rng, HELDOUT)) + _msg(lm, "assistant", rng.choice(HELDOUT.acks))
            ids += _filler(lm, b, rng, 64)
            while f.value == old:
                f.value = str(rng.randint(10000, 99999))
            ids += _msg(lm, "user", f.statement(rng, HELDOUT, update=True)) + _msg(lm, "assistant", rng.choice(HELDOUT.update_acks))
            for d, _, reply, ended in _sweep(lm, b, rng, ids, [f], distances):
                total_replies += 1
                ends += ended
                new[d] += f.value in reply
                stale[d] += old in reply and f.value not in reply
        out["update_correct"] = {d: new[d] / trials for d in distances}
        out["update_stale"] = {d: stale[d] / trials for d in distances}
    if "keys" in kinds:
        right = {d: 0 for d in distances}
        swapped = {d: 0 for d in distances}
        for t in range(trials):
            rng = random.Random(seed * 47 + t)
            pair = [held_out_code(rng)]
            while len(pair) < 2:
                f = held_out_code(rng)
                if f.key != pair[0].key and f.value != pair[0].value:
                    pair.append(f)
            ids = list(sys_ids)
            for i, f in enumerate(pair):
                ids += _msg(lm, "user", f.statement(rng, HELDOUT)) + _msg(lm, "assistant", rng.choice(HELDOUT.acks))
                ids += _filler(lm, b, rng, 32) if i == 0 else []
            for d, f, reply, ended in _sweep(lm, b, rng, ids, pair, distances):
                other = pair[1] if f is pair[0] else pair[0]
                total_replies += 1
                ends += ended
                right[d] += f.value in reply
                swapped[d] += other.value in reply and f.value not in reply
        out["keys_right"] = {d: right[d] / (2 * trials) for d in distances}
        out["keys_swapped"] = {d: swapped[d] / (2 * trials) for d in distances}
    out["ended_within_40"] = ends / max(1, total_replies)
    return out


def end_of_turn(lm: LoadedModel, passages: list[Passage], *, n: int = 40, max_new: int = 200, seed: int = EVAL_SEED) -> dict[str, Any]:
    """Share of free replies (held-out small talk and topic questions) that end their turn
    within `max_new` tokens, and a few samples."""
    b = make_builder(HELDOUT, passages, lm.tokenizer, lm.template)
    rng = random.Random(seed * 43)
    ended = 0
    samples = []
    for i in range(n):
        user = b.filler(rng)[0]["content"]
        prompt = _msg(lm, "system", "", first=True) + _msg(lm, "user", user) + lm.template.reply_prefix(lm.tokenizer)
        reply, ok = greedy(lm, lm.model.new_state(1), prompt, max_new)
        ended += ok
        if i < 6:
            samples.append({"user": user, "reply": reply})
    return {"ended_within_200": ended / n, "n": n, "samples": samples}
