"""Dialogues in plain speech: everyday details said in passing, asked about later, changed,
and never given; everyday questions with short fluent replies between them.

Phase 6's rows. The older phases taught recall on template facts ("the code for the X is
V") amid docstring answers; a new user instead says "I parked on level 4" and, twenty
messages later, asks "where did I park?", and asks everyday questions the docstrings never
answer. Each row here is one conversation of exactly `length` tokens (as in
dialogues.py, so the packer gives each its own row):

- the concepts and their answers are `agent.probes.natural_text.CONCEPTS`; the phrasings
  are natural_phrasings.py's plus the cached paraphrases (natural_cache.json), never the
  probe's held-out ones;
- a detail is stated alone, with another, or inside a message about something else;
- questions come after a drawn gap, and as often about a concept never stated in the row
  ("You haven't told me ..."), at the same moments, so "not told" is decided by the key;
- an update changes a detail, and later questions get the new value;
- between them: everyday questions with the cached short replies, the older small talk,
  and now and then a docstring answer (so the older skills stay in use).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from agent.recall import rule as refresh
from agent.probes.natural_text import CONCEPTS, HELDOUT_VALUES, Concept, make_value
from recipes.demo_model.dialogues import SMALL_TALK, Builder, Message
from recipes.experiments.natural_phrasings import ACKS, PHRASINGS, TRAIN_VALUES, UPDATE_ACKS

CACHE = Path(__file__).with_name("natural_cache.json")
RECALL_AFTER = 128  # tokens: a question this long after its statement may come after a recall block
_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vin", "do", "pe", "ra", "zu", "ne", "bo", "li", "tam", "fe", "gor", "ul",
              "es", "an", "tri", "mo", "hal", "ki", "sen", "dar", "ope", "ba", "nu", "xe")
_MADE_UP_KINDS = ("person", "place", "food", "color", "job", "date")
_HELDOUT = {v.lower() for pool in HELDOUT_VALUES.values() for v in pool}


def made_up_word(rng: random.Random) -> str:
    """A word no pool holds, two or three syllables, never one of the probe's values."""
    while True:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        if w not in _HELDOUT:
            return w


def train_value(rng: random.Random, kind: str, made_up: float) -> str:
    """A training value of `kind`: from TRAIN_VALUES, or with chance `made_up` (names,
    places, foods, colors, jobs, months) a made-up word, capitalized where a name is."""
    if made_up and kind in _MADE_UP_KINDS and rng.random() < made_up:
        w = made_up_word(rng)
        if kind == "date":
            return f"{w.capitalize()} {rng.randint(1, 28)}"
        return w.capitalize() if kind in ("person", "place") else w
    return make_value(rng, kind, TRAIN_VALUES)


@dataclass(frozen=True)
class NaturalSpec:
    """Shape of one plain-speech row: its token length, the gap range of its questions and
    how often each kind of turn comes."""

    length: int
    gap_min: int
    gap_max: int
    max_live: int = 4
    plant_prob: float = 0.35
    update_prob: float = 0.08
    ghost_prob: float = 0.8  # per planted detail: also ask about a concept never stated, at a gap drawn the same way
    near_gap: float = 0.25  # chance a question comes within 24 tokens of its statement
    everyday: float = 0.75  # share of the other exchanges that are everyday questions with cached replies
    docstring: float = 0.1  # share that are docstring answers (the rest: the older small talk)
    # Share of names, places, foods, colors, jobs and months that are made-up words instead
    # of the TRAIN_VALUES pools. Measured after 1,800 steps on the pools alone: asked at
    # once, the model gave a training value of the right kind ("Your favorite color is
    # yellow." for maroon) instead of copying; made-up values leave copying as the only way.
    made_up: float = 0.0
    # Chance that a question asked more than RECALL_AFTER tokens after its statement comes
    # after the recall block chat would fold (agent/recall/rule.py's header and format), and
    # half that chance that a never-stated question comes after a block about other details.
    # Measured on the same model: with the block holding the value 100% of the time at
    # 2,048 tokens, it recalled 23%; it had never seen a block.
    recall_block: float = 0.0


@lru_cache(maxsize=1)
def cache() -> dict[str, Any]:
    """The committed generator output (generate_natural.py); empty parts if it is absent."""
    if not CACHE.exists():
        return {"paraphrases": {}, "everyday": [], "everyday_heldout": []}
    return json.loads(CACHE.read_text(encoding="utf-8"))


def phrasings(concept: Concept) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Training statements, questions and updates of `concept`: hand-written plus cached."""
    statements, questions, updates = PHRASINGS[concept.name]
    extra = cache()["paraphrases"].get(concept.name, {})
    return statements + tuple(extra.get("statements", ())), questions + tuple(extra.get("questions", ())), updates


@dataclass
class _Live:
    concept: Concept
    value: str
    due: int
    ghost: bool = False
    said: str = ""  # the latest sentence stating it (what a recall block repeats)
    at: int = 0  # token position after that sentence


class NaturalBuilder:
    """Builds plain-speech rows; `base` (a dialogues.Builder of the training world) lends
    its system prompts, docstring answers, small talk, token counter and padding."""

    def __init__(self, base: Builder) -> None:
        self.base, self.count = base, base.count
        self.everyday = [(p["question"], p["reply"]) for p in cache()["everyday"]]
        self.stats: dict[str, int] = {}

    def _bump(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    def filler(self, rng: random.Random, spec: NaturalSpec) -> list[Message]:
        r = rng.random()
        if r < spec.everyday and self.everyday:
            q, a = rng.choice(self.everyday)
            return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if r < spec.everyday + spec.docstring:
            subject, reply = self.base.passage_reply(rng, 40)
            return [{"role": "user", "content": f"Tell me about {subject}."}, {"role": "assistant", "content": reply}]
        u, a = rng.choice(SMALL_TALK)
        return [{"role": "user", "content": u}, {"role": "assistant", "content": a}]

    def dialogue(self, rng: random.Random, spec: NaturalSpec) -> list[Message]:
        sys_msg, own_name = self.base.system(rng)
        msgs: list[Message] = [sys_msg]
        pos = self.count(sys_msg) + 1  # + BOS
        live: list[_Live] = []
        taken: set[str] = set()
        reserve = self.count({"role": "user", "content": "Okay"})

        def fits(new: list[Message]) -> bool:
            return pos + sum(self.count(m) for m in new) <= spec.length - reserve

        def gap() -> int:
            if rng.random() < spec.near_gap:
                return rng.randint(0, min(24, spec.gap_max))
            return rng.randint(spec.gap_min, spec.gap_max)

        def free() -> list[Concept]:
            return [c for c in CONCEPTS if c.name not in taken]

        def held() -> list[_Live]:
            return [lv for lv in live if not lv.ghost]

        for _ in range(400):
            due = [lv for lv in live if lv.due <= pos]
            r = rng.random()
            kind = "ask" if due else ("plant" if r < spec.plant_prob and len(held()) < spec.max_live and free() else
                                      "update" if r < spec.plant_prob + spec.update_prob and held() else "filler")
            new: list[Message]
            planted: list[_Live] = []
            if kind == "ask":
                lv = due[0]
                _, questions, _ = phrasings(lv.concept)
                reply = lv.concept.not_told if lv.ghost else lv.concept.answer.replace("{v}", lv.value)
                new = [{"role": "user", "content": rng.choice(questions)}, {"role": "assistant", "content": reply}]
                block = self._block(rng, spec, lv, held(), pos)
                if block:
                    new.insert(0, block)
            elif kind == "plant":
                pool = free()
                n = 1 if rng.random() < 0.75 else 2
                parts = []
                for c in rng.sample(pool, min(n, len(pool), spec.max_live - len(held()))):
                    value = train_value(rng, c.kind, spec.made_up)
                    statements, _, _ = phrasings(c)
                    parts.append(rng.choice(statements).replace("{v}", value))
                    planted.append(_Live(c, value, 0, said=parts[-1]))
                body = " ".join(parts)
                if rng.random() < 0.3:  # in passing, inside a message about something else
                    extra = self.filler(rng, spec)
                    new = [{"role": "user", "content": body + " " + extra[0]["content"]}, extra[1]]
                else:
                    new = [{"role": "user", "content": body}, {"role": "assistant", "content": rng.choice(ACKS)}]
            elif kind == "update":
                lv = rng.choice(held())
                old = lv.value
                old_said = lv.said
                while lv.value == old:
                    lv.value = train_value(rng, lv.concept.kind, spec.made_up)
                statements, _, updates = phrasings(lv.concept)
                text = rng.choice(updates) if updates and rng.random() < 0.6 else rng.choice(statements)
                lv.said = text.replace("{v}", lv.value)
                new = [{"role": "user", "content": lv.said}, {"role": "assistant", "content": rng.choice(UPDATE_ACKS)}]
            else:
                new = self.filler(rng, spec)
            if not fits(new):
                if kind == "ask":
                    break
                if kind == "update":
                    lv.value, lv.said = old, old_said
                planted = []
                kind = "filler"
                new = self.filler(rng, spec)
                if not fits(new):
                    break
            if kind == "ask":
                live.remove(due[0])
                self._bump("never" if due[0].ghost else "questions")
                if rng.random() < 0.25:  # asked again later
                    live.append(dataclasses.replace(due[0], due=pos + rng.randint(spec.gap_min, spec.gap_max)))
            elif kind == "plant":
                end = pos + sum(self.count(m) for m in new)
                for p in planted:
                    taken.add(p.concept.name)
                    p.due, p.at = pos + gap(), end
                    live.append(p)
                    self._bump("facts")
                    if rng.random() < spec.ghost_prob and free():
                        g = rng.choice(free())
                        taken.add(g.name)
                        live.append(_Live(g, "", pos + gap(), ghost=True))
            elif kind == "update":
                self._bump("updates")
                lv.at = pos + sum(self.count(m) for m in new)
                lv.due = max(lv.due, pos + rng.randint(spec.gap_min // 2, spec.gap_max // 2))
            msgs += new
            pos += sum(self.count(m) for m in new)
        msgs.append(self.base.pad(rng, spec.length - pos))
        return msgs

    def _block(self, rng: random.Random, spec: NaturalSpec, lv: _Live, held: list[_Live], pos: int) -> Message | None:
        """The recall block before the question about `lv`, or None: for a stated detail
        asked long after, the sentence that stated it (after the update, the update), now
        and then beside another detail's; for a never-stated one, other details' only."""
        if not spec.recall_block:
            return None
        others = [o for o in held if o is not lv and o.said and pos - o.at > RECALL_AFTER]
        if lv.ghost:
            if not others or rng.random() >= spec.recall_block / 2:
                return None
            lines = rng.sample(others, min(len(others), rng.randint(1, 2)))
        else:
            if pos - lv.at <= RECALL_AFTER or rng.random() >= spec.recall_block:
                return None
            lines = [lv] + (rng.sample(others, 1) if others and rng.random() < 0.3 else [])
        lines.sort(key=lambda o: o.at)
        self._bump("recall_blocks")
        chosen = [refresh.Recalled(0, "user", o.said, pos - o.at, 0.0) for o in lines]
        return {"role": refresh.BLOCK_ROLE, "content": refresh.render(chosen)}
