"""Seeded synthetic text: seeds, keys and values to plant, distractors, log lines.

Nothing here is copied from a corpus: every filler sentence and every planted fact is
generated from a seed, so a probe run is reproducible bit for bit and never downloads.
Seeds come from a sha256 of the parts that identify a sample (suite, probe, filler,
distance, trial), so adding a probe or a distance never shifts another sample's text.
The word lists and the small grammar live in `agent.recall.smalltalk`, because the recall
horizon of an input-driven model is measured on the same small talk as the chat filler.
"""

from __future__ import annotations

import hashlib
import random

from agent.recall.smalltalk import ADJECTIVES, NOUNS, chat_exchange, sentence

__all__ = [
    "ADJECTIVES", "NOUNS", "VALUE_KINDS", "chat_exchange", "distinct_keys", "log_line", "make_key", "make_value",
    "rng_of", "same_shape", "seed_of", "sentence",
]

VALUE_KINDS = ("digits", "words", "hex")


def seed_of(*parts: object) -> int:
    """A 64-bit seed from a sha256 of the parts (stable across runs and Python versions)."""
    h = hashlib.sha256("|".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "little")


def rng_of(*parts: object) -> random.Random:
    return random.Random(seed_of(*parts))


def make_key(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"


def distinct_keys(rng: random.Random, n: int) -> list[str]:
    if n > len(ADJECTIVES) * len(NOUNS):
        raise ValueError(f"at most {len(ADJECTIVES) * len(NOUNS)} distinct keys")
    keys: list[str] = []
    seen: set[str] = set()
    while len(keys) < n:
        k = make_key(rng)
        if k not in seen:
            seen.add(k)
            keys.append(k)
    return keys


def make_value(rng: random.Random, kind: str) -> str:
    """A value to plant: a 5-digit number, a word pair or a 6-digit hex id."""
    if kind == "digits":
        return str(rng.randint(10000, 99999))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    if kind == "hex":
        return "0x" + "".join(rng.choice("0123456789abcdef") for _ in range(6))
    raise ValueError(f"unknown value kind {kind!r}; expected one of {', '.join(VALUE_KINDS)}")


def same_shape(rng: random.Random, text: str) -> str:
    """A random string shaped like `text`: digits stay digits, letters keep their case,
    everything else is kept. Used for distractors of a user's own expected answer."""
    out = []
    for ch in text:
        if ch.isdigit():
            out.append(rng.choice("0123456789"))
        elif ch.isalpha() and ch.isascii():
            pool = "abcdefghijklmnopqrstuvwxyz"
            c = rng.choice(pool)
            out.append(c.upper() if ch.isupper() else c)
        else:
            out.append(ch)
    return "".join(out)


def log_line(rng: random.Random, index: int) -> str:
    """A synthetic terminal log line, heavy in numbers (distractors for numeric values)."""
    level = rng.choice(("INFO", "INFO", "INFO", "WARN", "DEBUG", "ERROR"))
    hh, mm, ss = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    pid = rng.randint(1000, 99999)
    what = rng.choice((
        f"request {rng.randint(10000, 99999)} took {rng.randint(1, 999)} ms",
        f"worker {rng.randint(1, 64)} processed {rng.randint(1, 9999)} items",
        f"cache hit ratio {rng.randint(0, 100)}% size {rng.randint(1, 4096)} MB",
        f"retry {rng.randint(1, 9)} for job 0x{rng.randrange(16 ** 6):06x}",
        f"port {rng.randint(1024, 65535)} open, {rng.randint(0, 500)} connections",
    ))
    return f"{hh:02d}:{mm:02d}:{ss:02d} [{level}] pid={pid} #{index} {what}"
