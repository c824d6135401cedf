"""A plain-text lookup task: the smallest form of "recall the value stored under this key".

One record lists twelve single-token words, each followed by a 5-digit number, then asks
them all again in shuffled order:

    Keys and codes: harbor 58213, window 40921, ... Asked again: window 40921, harbor 58213, ...

The first digit after a repeated word can only come from matching that word against the
list (the other four digits can be copied from what followed that first digit). This is
the associative recall that a chat model needs to answer "what is the pin for the blue
locker?" with the blue locker's pin and not the latest pin it heard, without any of the
chat around it. The phase-3 model got the first digit right 0.09 of the time (chance
0.10). Measured on a toy of the same shape (4 layers, width 256, 8 heads of 32 x 32) from
scratch, four random one-token keys and values a row: at chance for about 450 steps, then
learning; such recall comes late and suddenly in this architecture, so phase 4 gives it
dense, clean examples.
"""

from __future__ import annotations

import random

import torch

from recipes.default_model.vocab import TRAIN
from agent.runtime.checkpoint import LoadedModel
from agent.runtime.tokenizer import Tokenizer

PAIRS = 12


def key_words(tok: Tokenizer) -> list[str]:
    """Lower-case words of five or more letters that are one token with a leading space; with
    too few of those (a byte-level tokenizer), the training world's nouns, whatever their
    token count."""
    out = []
    for i in range(tok.vocab_size):
        s = tok.decode([i])
        if s.startswith(" ") and s[1:].isalpha() and s[1:].islower() and len(s) >= 5:
            out.append(s[1:])
    return out if len(out) >= 4 * PAIRS else list(TRAIN.thing_noun)


def record(rng: random.Random, words: list[str], n: int = PAIRS, style: str = "word") -> str:
    """One record. Styles, from the plainest to the closest to a chat answer ("... the blue
    locker is 58213"):
    - "word": `harbor 58213`, the key right before the value;
    - "is": `harbor is 58213`, the key three tokens before the value's first digit;
    - "pair": `the red harbor is 58213`, two-word keys, a third of them sharing a word with
      an earlier key, so that only both words tell them apart."""
    if style == "pair":
        keys: list[str] = []
        while len(keys) < n:
            a, b = rng.sample(words, 2)
            if keys and rng.random() < 1 / 3:
                other = rng.choice(keys).split()
                a, b = (other[0], b) if rng.random() < 0.5 else (a, other[1])
            if a != b and f"{a} {b}" not in keys:
                keys.append(f"{a} {b}")
    else:
        keys = rng.sample(words, n)
    values = [str(rng.randint(10000, 99999)) for _ in keys]
    order = list(range(n))
    rng.shuffle(order)
    link = {"word": "{k} {v}", "is": "{k} is {v}", "pair": "the {k} is {v}"}[style]
    first = ", ".join(link.format(k=k, v=v) for k, v in zip(keys, values))
    again = ", ".join(link.format(k=keys[i], v=values[i]) for i in order)
    return f"Keys and codes: {first}. Asked again: {again}."


@torch.inference_mode()
def first_digit_accuracy(lm: LoadedModel, words: list[str], trials: int = 40, seed: int = 99) -> float:
    """Share of asked-again words whose next token (greedy) is the first digit of its value."""
    lm.model.eval()
    rng = random.Random(seed)
    tok = lm.tokenizer
    hit = total = 0
    for _ in range(trials):
        head, tail = record(rng, words).split("Asked again: ")
        ids = tok.encode(head + "Asked again:")
        for item in tail.rstrip(".").split(", "):
            key, value = item.split(" ")
            prompt = ids + tok.encode(" " + key + " ")
            logits, _ = lm.model(torch.tensor([prompt]), lm.model.new_state(1), last_only=True)
            hit += tok.decode([int(logits[0, -1].argmax())]) == value[0]
            total += 1
            ids = prompt + tok.encode(value + ",")
    return hit / total
