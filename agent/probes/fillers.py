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


@dataclass(frozen=True)
class Piece:
    """One piece of a filler stream: token positions [start, end), role and text."""

    start: int
    end: int
    role: str
    text: str


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
        return self.pieces(n, rng)[0]

    def pieces(self, n: int, rng: random.Random) -> tuple[list[int], list[Piece]]:
        """`tokens(n, rng)` and the pieces it is made of, as transcript turns (a chat message,
        a sentence, a log line; a file is one piece), for recall refresh to choose among."""
        if n <= 0:
            return [], []
        if self.name.startswith("file:"):
            ids = self._from_file(n, rng)
            return ids, [Piece(0, len(ids), "document", self.tok.decode(ids))]
        ids: list[int] = []
        out: list[Piece] = []
        if self.name == "noise":
            phrase = " ".join(rng.choice(text.NOUNS + text.ADJECTIVES) for _ in range(4)) + ". "
            unit = self.tok.encode(phrase)
            while len(ids) < n:
                out.append(Piece(len(ids), len(ids) + len(unit), "user", phrase.strip()))
                ids += unit
        else:
            index = 0
            while len(ids) < n:
                for role, body, m in self._piece(rng, index):
                    out.append(Piece(len(ids), len(ids) + len(m), role, body))
                    ids += m
                index += 1
        return ids[:n], [p for p in out if p.start < n]

    def _piece(self, rng: random.Random, index: int) -> list[tuple[str, str, list[int]]]:
        if self.name == "grammar":
            s = text.sentence(rng)
            return [("user", s, self.tok.encode(s + " "))]
        if self.name == "logs":
            line = text.log_line(rng, index)
            return [("user", line, self.tok.encode(line + "\n"))]
        if self.name == "chat":
            user, reply = text.chat_exchange(rng)
            return [("user", user, self.template.message(self.tok, "user", user)),
                    ("assistant", reply, self.template.message(self.tok, "assistant", reply))]
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
