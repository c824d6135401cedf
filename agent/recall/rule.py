"""Which earlier turns to read again before answering, as one pure rule, and the block they make.

A fixed state forgets: past the model's recall horizon a detail is likely gone from it,
while the transcript still holds it word for word. Before a reply, the chat service asks
the session's full-text index for turns sharing words with the user's message; this
module decides which of them to fold back in, and how the recall block reads. The probe
suites (`laplace probe run --refresh both`, `laplace probe natural`) build their blocks with
the very same `build_block`, so what they measure is what chat does.

The rule, in order:
1. content words of the message (lower case, stop and discourse words dropped, word
   forms folded: "lockers", "parked", "parking" and "grew" count as "locker", "park" and
   "grow");
2. a candidate turn is eligible only if it ended more than `horizon` tokens ago (turns
   the state still holds are never repeated), shares enough of those words (one when
   the message has one or two content words, else two; when no turn shares two, one
   sharing the message's rarest word among the candidates will do: "What day is my
   dentist appointment?" finds "I see the dentist on May 3."), and is not superseded: a
   later turn of the same role, not a question, sharing the same words or more, two at
   least (a code stated, then updated: only the update counts; if it is within the
   horizon, nothing is recalled; one word in common, like "moving" in later chat, is no
   sign of an update);
3. each eligible turn is cut down to its sentences sharing the most words with the
   message (left out if those are all questions: an earlier "what is my code?" holds
   no answer; nor does an earlier "You haven't told me your name."), and scored by the
   summed rarity (idf over the candidates) of the words it shares;
4. the best are taken while the whole block, template tokens included, stays within
   `budget` tokens; ties go to the more recent turn (after an update, the new value);
5. the block lists them oldest first, under a header that says what it is.

No torch, no SQL: candidates arrive as plain records, and token counts through a callback.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

HEADER = "Recalled from earlier in this conversation:"
BLOCK_ROLE = "document"  # the chat-template role a recall block is folded as
DEFAULT_BUDGET = 256  # tokens per turn, template tokens included
MAX_CANDIDATES = 50  # how many full-text hits the chat service passes in
MAX_QUERY_WORDS = 32  # words of the message looked up in the index
MAX_CHARS_PER_TOKEN = 16  # a line longer than budget x this many characters is not tried
# Labels for whose words a recalled line holds; the block is read by the assistant.
ROLE_LABELS = {"user": "User", "assistant": "Assistant", "document": "Document", "system": "System"}

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# A sentence saying a detail was never given (it holds no answer); the natural probe's
# verdict (agent/probes/natural_text.py) widens it.
NOT_TOLD = re.compile(r"haven'?t told|have not told|didn'?t tell|did not tell|never told", re.I)
STOP_WORDS = frozenset("""
a about above after again all also am an and any are as at be been before being but by can could did do does
doing done for from had has have having he her here hers him his how i if in into is it its itself just know
let me mine my myself no not now of off on once only or our ours out over please remember remind said say
she should so some still such tell than thank thanks that the their them then there these they this those
to told too under until up us very was we were what whats when where which while who whom why will with
would yes you your yours yourself earlier recall recalled conversation
sorry hey hi hello hmm oh okay ok well quick question again actually really just thing one anyway
""".split())
# Common irregular past forms, folded to the base form (the index's stemmer does not
# join them either, so the lookup asks for every form: `query_words`).
IRREGULAR = {
    "grew": "grow", "grown": "grow", "went": "go", "gone": "go", "bought": "buy", "left": "leave", "met": "meet",
    "took": "take", "taken": "take", "flew": "fly", "flown": "fly", "drove": "drive", "driven": "drive", "gave": "give",
    "given": "give", "got": "get", "gotten": "get", "made": "make", "put": "put", "sat": "sit", "kept": "keep",
    "chose": "choose", "chosen": "choose", "wrote": "write", "written": "write", "ate": "eat", "eaten": "eat",
    "paid": "pay", "sent": "send", "spent": "spend", "told": "tell", "found": "find", "moved": "move", "lived": "live",
}


@dataclass(frozen=True)
class Candidate:
    """A turn that might be recalled: its id, role, text, and how many tokens ago it ended."""

    turn_id: int
    role: str
    text: str
    distance: int


@dataclass(frozen=True)
class Recalled:
    """A chosen turn and the part of it the block repeats."""

    turn_id: int
    role: str
    line: str
    distance: int
    score: float


def terms(text: str) -> list[str]:
    """Content words of `text`, in order, without repeats."""
    out: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w in STOP_WORDS or (len(w) < 2 and not w.isdigit()):
            continue
        out[_stem(w)] = None
    return list(out)


def _stem(word: str) -> str:
    """A light fold of English word forms: irregular pasts, then a plural "s", "-ing" or
    "-ed", then a final "e" ("moved", "moving", "moves" -> "mov"), keeping at least three
    letters. Both sides of a comparison are folded the same way, so it need not be a word."""
    if word.isdigit():
        return word
    word = IRREGULAR.get(word, word)
    for suffix in ("ing", "ed", "s"):
        if word.endswith(suffix) and not word.endswith("ss") and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def query_words(text: str, limit: int = MAX_QUERY_WORDS) -> list[str]:
    """The words to look up in the full-text index (its own stemmer folds their forms):
    the first `limit` distinct content words, so a pasted page stays a cheap lookup."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w not in STOP_WORDS and (len(w) >= 2 or w.isdigit()):
            seen[w] = None
            base = IRREGULAR.get(w, w)
            for form in (base, *(k for k, v in IRREGULAR.items() if v == base)):
                seen[form] = None
            if len(seen) >= limit:
                break
    return list(seen)[:limit]


def _relevant_part(text: str, query: set[str]) -> str:
    """The sentences of `text` sharing the most words with the query (all of it when none
    share any): "The code for the red gate is 1. The code for the blue van is 2." asked
    about the blue van repeats only the second sentence."""
    parts = [p.strip() for p in _SENTENCE.split(text) if p.strip()]
    shared = [len(query & set(terms(p))) for p in parts]
    best = max(shared, default=0)
    return " ".join(p for p, n in zip(parts, shared) if n == best) if best else text.strip()


def _is_question(text: str) -> bool:
    """Every sentence of `text` is a question."""
    parts = [p.strip() for p in _SENTENCE.split(text) if p.strip()]
    return bool(parts) and all(p.endswith("?") for p in parts)


def render(chosen: Sequence[Recalled]) -> str:
    """The recall block's text: the header, then one line per turn, oldest first."""
    lines = [f"{ROLE_LABELS.get(r.role, r.role.title())}: {r.line}" for r in chosen]
    return HEADER + "\n\n" + "\n".join(lines)


def select(message: str, candidates: Iterable[Candidate], *, horizon: int, budget: int,
           count: Callable[[str], int]) -> list[Recalled]:
    """The turns to recall before answering `message`, oldest first (see the module docstring).

    `count(block_text)` gives the tokens the block would take when folded (template
    included); the result's rendered block never exceeds `budget` of them."""
    query = terms(message)
    if not query or budget <= 0:
        return []
    qset = set(query)
    need = 1 if len(qset) <= 2 else 2
    pool = [c for c in candidates if c.text.strip()]
    df: dict[str, int] = {}
    for c in pool:
        for t in qset & set(terms(c.text)):
            df[t] = df.get(t, 0) + 1
    # Statements: a later one of the same role covering the same words of the message (or
    # more) supersedes an earlier one, e.g. a code stated, then updated.
    said = [(c.distance, c.role, qset & set(terms(c.text))) for c in pool if not _is_question(c.text)]

    def eligible(c: Candidate, enough: int) -> tuple[set[str], str] | None:
        """(shared words, the part to repeat) when `c` may be recalled with `enough` shared words."""
        shared = qset & set(terms(c.text))
        if c.distance <= horizon or len(shared) < enough:
            return None
        # (Two words at least: one common word in later chat is no sign of an update.)
        if any(d < c.distance and role == c.role and words >= shared and len(words) >= 2 for d, role, words in said):
            return None
        line = _relevant_part(c.text, qset)
        # An earlier question carries no answer, nor an earlier "you haven't told me".
        return None if _is_question(line) or NOT_TOLD.search(line) else (shared, line)

    found = [(c, e) for c in pool if (e := eligible(c, need))]
    if not found and need > 1 and df:  # nothing shares two words: one sharing the rarest will do
        rarest = {t for t, n in df.items() if n == min(df.values())}
        found = [(c, e) for c in pool if (e := eligible(c, 1)) and e[0] & rarest]
    ranked = [Recalled(c.turn_id, c.role, line, c.distance, round(sum(math.log(1 + len(pool) / df[t]) for t in shared), 6))
              for c, (shared, line) in found]
    # Best score first; among equals the most recent (smallest distance), then the newest id.
    ranked.sort(key=lambda r: (-r.score, r.distance, -r.turn_id))
    chosen: list[Recalled] = []
    for r in ranked:
        if len(r.line) > budget * MAX_CHARS_PER_TOKEN:  # cannot fit: spare tokenizing it
            continue
        trial = sorted(chosen + [r], key=lambda x: (-x.distance, x.turn_id))
        if count(render(trial)) <= budget:
            chosen = trial
    return chosen


@dataclass(frozen=True)
class Block:
    """A recall block ready to fold: its text, its token ids and the turns it repeats."""

    text: str
    token_ids: list[int]
    chosen: list[Recalled]


def build_block(message: str, candidates: Iterable[Candidate], *, horizon: int, budget: int,
                encode: Callable[[str], list[int]]) -> Block | None:
    """`select` then `render`: the block to fold before `message`, or None when no turn
    qualifies. `encode(text)` gives the ids the block is folded as (its chat-template turn),
    so the budget counts exactly the tokens that will be read."""
    chosen = select(message, candidates, horizon=horizon, budget=budget, count=lambda text: len(encode(text)))
    if not chosen:
        return None
    text = render(chosen)
    return Block(text, encode(text), chosen)
