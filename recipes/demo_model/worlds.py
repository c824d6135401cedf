"""The worlds (keys, values and phrasings) the shipped stages' dialogues are drawn from.

- "train" (`vocab.TRAIN`): phase 1's world.
- "phase2": TRAIN widened with thousands of key words from the training docstrings
  (`vocab.widened`), so matching a key cannot be memorized per word; minus every word the
  held-out world or the probe suite uses as a key.
- "phase3": phase 2's world said in twice as many ways (`vocab.varied`): with TRAIN's six
  statement shapes the model did not take a held-out "I set the pin for the roof scanner
  to 22730." as a fact.
- phase 5's drills (`drill_world`): phase 3's world, composed phrasings (`vocab.composed`)
  and keys of made-up words (`fragment_words`) that a reply can only name by copying.
"""

from __future__ import annotations

import dataclasses
import random
import re

from agent.probes import text as probe_text
from agent.runtime.tokenizer import Tokenizer
from recipes.demo_model.corpus import Passage
from recipes.demo_model.vocab import HELDOUT, TRAIN, World, composed, varied, widened

FRAGMENT_WORDS = 20_000  # thing adjectives and nouns each, for phase 5's drills
BANNED = frozenset((*HELDOUT.thing_adj, *HELDOUT.thing_noun, *probe_text.ADJECTIVES, *probe_text.NOUNS, "is", "for", "the"))


def phase2_world(train_passages: list[Passage]) -> World:
    """The training world widened with the training docstrings' words, minus every word the
    held-out world or the probe suite uses as a key."""
    banned = tuple(HELDOUT.thing_adj) + tuple(HELDOUT.thing_noun) + tuple(probe_text.ADJECTIVES) + tuple(probe_text.NOUNS)
    return widened(TRAIN, (p.text for p in train_passages), banned=banned)


def phase3_world(train: list[Passage]) -> World:
    """Phase 2's widened world, said in twice as many ways (`vocab.varied`)."""
    return varied(phase2_world(train))


def world(name: str, train: list[Passage]) -> World:
    """A `plan.Chat` world by name."""
    worlds = {"train": lambda: TRAIN, "phase2": lambda: phase2_world(train), "phase3": lambda: phase3_world(train)}
    if name not in worlds:
        raise ValueError(f"unknown world {name!r}; expected one of {', '.join(worlds)}")
    return worlds[name]()


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


def drill_world(train: list[Passage], tok: Tokenizer, rng: random.Random) -> World:
    """Phase 3's world, composed phrasings, keys of fragment words; the training attributes
    ("pin", "code", ...) three times as often as fragment ones."""
    w = composed(phase3_world(train))
    attrs = phase2_world(train).code_attrs
    return dataclasses.replace(w, thing_adj=fragment_words(tok, rng, FRAGMENT_WORDS), thing_noun=fragment_words(tok, rng, FRAGMENT_WORDS),
                               code_attrs=attrs * 3 + fragment_words(tok, rng, len(attrs)))
