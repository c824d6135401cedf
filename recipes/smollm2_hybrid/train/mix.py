"""Training sequences for the attention transfer: a weighted mix of the corpus's sources.

Sequence i is a pure function of (seed, i): a source drawn by weight, a document of it
drawn by length (so each of its tokens is equally likely), and a window of `length` tokens
at a drawn offset; a document shorter than that is followed by the next ones of the same
source, joined by the end-of-text token. So the data cursor of a run is just the index of
its next sequence, and a resumed run reads exactly what an uninterrupted one would.

Source weights: a source's token count to the power `temperature` (below 1 evens the mix
out), times its multiplier from the plan (the State of the Union speeches, 22% of the
corpus's tokens, are turned down there).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Doc:
    source: str
    text: str


def read_docs(path: Path) -> list[Doc]:
    """The corpus builder's JSONL (train.jsonl or heldout.jsonl), in file order."""
    with open(path, encoding="utf-8") as f:
        return [Doc(d["source"], d["text"]) for d in map(json.loads, f)]


def source_weights(docs: Sequence[Doc], temperature: float, multipliers: dict[str, float]) -> dict[str, float]:
    """Each source's share of the draws (summing to 1), from its characters (a stand-in for
    tokens that needs no tokenizer) ** temperature * its multiplier."""
    chars: dict[str, int] = {}
    for d in docs:
        chars[d.source] = chars.get(d.source, 0) + len(d.text)
    raw = {s: n ** temperature * multipliers.get(s, 1.0) for s, n in sorted(chars.items())}
    total = sum(raw.values())
    return {s: w / total for s, w in raw.items()}


class SequenceMix:
    """`sequence(i)`: the i-th training sequence, `length` token ids."""

    def __init__(self, docs: Sequence[Doc], encode: Callable[[str], list[int]], eot: int, length: int, *,
                 seed: int, temperature: float, multipliers: dict[str, float]) -> None:
        self.encode, self.eot, self.length, self.seed = encode, eot, length, seed
        self.weights = source_weights(docs, temperature, multipliers)
        self.by_source: dict[str, list[Doc]] = {s: [d for d in docs if d.source == s] for s in self.weights}
        self._ids: dict[tuple[str, int], list[int]] = {}  # documents tokenized so far

    def _doc_ids(self, source: str, j: int) -> list[int]:
        key = (source, j)
        if key not in self._ids:
            self._ids[key] = self.encode(self.by_source[source][j].text)
        return self._ids[key]

    def sequence(self, i: int) -> list[int]:
        rng = random.Random(self.seed * 1_000_003 + i)
        sources = list(self.weights)
        source = rng.choices(sources, weights=[self.weights[s] for s in sources])[0]
        docs = self.by_source[source]
        j = rng.choices(range(len(docs)), weights=[len(d.text) for d in docs])[0]
        ids = list(self._doc_ids(source, j))
        k = j
        while len(ids) < self.length:  # a short document: the source's next ones after it
            k = (k + 1) % len(docs)
            ids += [self.eot] + self._doc_ids(source, k)
        start = rng.randrange(len(ids) - self.length + 1)
        return ids[start:start + self.length]
