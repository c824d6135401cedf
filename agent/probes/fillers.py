"""Fillers: the seeded token streams placed between a planted fact and the question.

Kinds: `noise` (one short random phrase repeated), `grammar` (sentences from a small
grammar), `chat` (synthetic user/assistant turns in the model's own chat template), `logs`
(number-heavy terminal lines, distractors for numeric values) and `file:PATH` (the user's
own text, read from a seeded offset). A filler yields exactly the number of tokens asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from agent.runtime.tokenizer import ChatTemplate, Tokenizer

from agent.probes import text

FILLER_KINDS = ("noise", "grammar", "chat", "logs")


class FillerError(ValueError):
    """A filler name is unknown or its file cannot be used."""


@dataclass
class Filler:
    """A named generator of filler token ids."""

    name: str
    tok: Tokenizer
    template: ChatTemplate
    _file_ids: list[int] = field(default_factory=list)

    def tokens(self, n: int, rng: random.Random) -> list[int]:
        """Exactly `n` token ids (cut mid-piece where needed)."""
        if n <= 0:
            return []
        if self.name.startswith("file:"):
            return self._from_file(n, rng)
        ids: list[int] = []
        if self.name == "noise":
            phrase = " ".join(rng.choice(text.NOUNS + text.ADJECTIVES) for _ in range(4)) + ". "
            unit = self.tok.encode(phrase)
            while len(ids) < n:
                ids += unit
        else:
            index = 0
            while len(ids) < n:
                ids += self._piece(rng, index)
                index += 1
        return ids[:n]

    def _piece(self, rng: random.Random, index: int) -> list[int]:
        if self.name == "grammar":
            return self.tok.encode(text.sentence(rng) + " ")
        if self.name == "logs":
            return self.tok.encode(text.log_line(rng, index) + "\n")
        if self.name == "chat":
            user, reply = text.chat_exchange(rng)
            return self.template.message(self.tok, "user", user) + self.template.message(self.tok, "assistant", reply)
        raise FillerError(f"unknown filler {self.name!r}")

    def _from_file(self, n: int, rng: random.Random) -> list[int]:
        ids = self._file_ids
        start = rng.randrange(len(ids))
        out: list[int] = []
        while len(out) < n:  # a short file is cycled from the seeded offset
            out += ids[start : start + n - len(out)]
            start = 0
        return out


def make_filler(name: str, tok: Tokenizer, template: ChatTemplate) -> Filler:
    """A filler by name; `file:PATH` reads the file now, so a bad path fails before any run."""
    if name.startswith("file:"):
        path = Path(name[5:]).expanduser()
        try:
            content = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise FillerError(f"cannot read filler file {path}: {exc.strerror or exc}") from None
        ids = tok.encode(content)
        if not ids:
            raise FillerError(f"filler file {path} is empty")
        return Filler(name, tok, template, ids)
    if name not in FILLER_KINDS:
        raise FillerError(f"unknown filler {name!r}; expected one of {', '.join(FILLER_KINDS)} or file:PATH")
    return Filler(name, tok, template)
