"""Issue 36's training mix: details stated among small talk and asked 0-200 tokens later,
the same questions after a recall block, updates, never-given details, and anchors.

    python -m recipes.answer.mix --out DIR [--train 4000] [--eval 200] [--seed 0] [--anchors teacher.jsonl]

writes DIR/train.jsonl (`concepts.TRAIN_CONCEPTS`) and DIR/eval.jsonl (the held-out
`EVAL_CONCEPTS` only, no anchors) as `laplace finetune` chat JSONL, and DIR/stats.json.

Kinds of dialogue (`KIND_SHARES`):
- "window": one to four details (often two of the same kind) stated among small talk, then
  small talk of `GAP_TOKENS` (0-200 tokens) before the first question, so the statement is
  inside the window; one to three questions, phrased unlike the statements.
- "recall": the details were said long ago (beyond the window); before each question comes
  the recall block exactly as chat folds it: `agent.recall.rule.select` + `render` over the
  earlier turns (the real rule and formatter, imported), as a `document` turn.
- "update": a detail stated, small talk, then superseded by a later statement; the answer is
  the later value (in the window, or through the block when `recall` applies as well).
- "long" (only with `--long-share`): as "window", but `--long-gap` (300-1,500) tokens of chat
  pass before the questions, so the statements have left the 256-token window: the model
  answers from its memory of evicted tokens, or, for a statement that ended more than
  `--horizon` tokens ago, from the recall block chat folds then (the real rule over the real
  turns, as in "recall"). Half the questions ask for a detail never given. The chat is small
  talk, anchors' exchanges and made-up `chatter` that names everyday things, colors and people
  and states nothing, so a word of the question met in the chat is not an answer (in the
  probe's refresh-on conversations, whose filler names lockers and colors, "Which locker is
  mine?" got "You said you live in the locker."). Each fits one row of `--seq-len 2048`.
  `--long-doc P`: a share P of them pass that gap as pasted prose instead (the user shares
  pieces of the Python reference, `text_records`, each acknowledged with weight 0), so a
  detail is asked for after a long stretch of text that is not chat: the memory's pass key
  (a code stated once in long filler) got a filler word back from the tuned model
  (': "Coral"') where the base gave the digits.
- "anchor": an everyday request (recipes/answer/requests.py) answered in the teacher's own
  words (recipes/answer/teacher.py), after a stated detail; about a third of the requests
  mention the user's own things and ask for something new. `FRESH_ANCHOR_SHARE` of them are
  a fresh chat with one or two requests and nothing stated (a plain question after nothing
  said is answered, never "not told"). `--social-weight K` draws each social anchor (a
  greeting, thanks, a goodbye, a question about the assistant: `SOCIAL_REQUESTS`) K times as
  often as the others (the tuned model answered "Say hi." with "You said you're a chatbot"),
  except those whose reply disclaims "as a chatbot" (`DISCLAIMS`).
- `--gap LO,HI` and `--window-share`: longer small talk before the question, and more
  window dialogues (run 3b's continuation: 60-200 tokens, the far end of the window).
  `--gap-chatter P`: a share P of the window and update dialogues fill that gap with
  `chatter` (and small talk), whose names, colors and numbers are distractors of the
  details' own kinds (at 128 tokens the probe's misses gave a name, a number or a color from
  the conversation's other lines instead of the user's).
  `--reach N` lets a window question ask about a detail stated up to N tokens back (at most
  `MAX_REACH`, 244, the window's edge). `--edge-rival P`: a share P of the window dialogues
  that state two details of the same kind and ask one state the asked one first, its gap
  aimed 30-80 tokens short of the reach (the last exchange may run past the aim, never past
  the reach), and the other last, nearer the question. `--rival-first F`: a share F of
  those draws turn the order round: the rival first, farther back (often past the reach),
  and the asked detail after it, at the edge (the second held-out set's misses at 241-253
  tokens gave the weekday or name stated *before* the asked one, with the window at 256
  tokens and at 512 alike). `--even-pairs P`: a share P of the window dialogues state two
  details of one kind and ask one of them, the kind drawn evenly over the kinds with two or
  more concepts. Without it a third of the window dialogues ask about one of a same-kind pair
  (105 of 300 drawn), a quarter of those persons; with P = 1 nearly all do (296 of 300),
  each kind about as often, days (8 -> 19) among them: the second held-out set's same-kind
  misses at the edge were weekdays as often as names.
- plain text (`--text N`): N records of the Python reference's prose, trained as a document,
  so the tuned model still reads prose as the base does.

About a third of all questions ask for a detail never given (`NOT_TOLD_SHARE`), half of
those of a kind that was given; the reply is the concept's short "you haven't told me ..."
line. Only answers and anchors are targets: acknowledgements and small talk carry
`"weight": 0`. Token counts are estimated as characters / `CHARS_PER_TOKEN` (SmolLM2's BPE
averages ~4.2 on this English), so the recipe needs no tokenizer.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from agent.probes.natural_text import make_value, mentions, say
from agent.recall.rule import BLOCK_ROLE, Candidate, render, select
from recipes.answer.concepts import (ACKS, CHATTER_ADJECTIVES, CHATTER_ASKS, CHATTER_NOUNS, CHATTER_REPLIES, CHATTER_TOPICS,
                                     CHATTER_VERBS, EVAL_CONCEPTS, SMALL_TALK, TRAIN_CONCEPTS, TRAIN_VALUES, TrainConcept)
from recipes.answer.dialogues import read_anchors
from recipes.answer.requests import SOCIAL_REQUESTS

CHARS_PER_TOKEN = 4
GAP_TOKENS = (0, 200)  # small talk between the last statement and the first question ("window" kind)
WINDOW_REACH = 220  # a statement asked about in the window kinds starts at most this many tokens before the question (window 256)
MAX_REACH = 244  # --reach at most: the question (~10 tokens) then ends within the 256-token window
EDGE_SLACK = (30, 80)  # --edge-rival: the gap's target leaves this many tokens below the reach (a gap overshoots by up to an exchange)
MAX_TOKENS = 480  # a dialogue fits one row of --seq-len 512 (--pack rows)
KIND_SHARES = {"window": 0.52, "recall": 0.22, "update": 0.12, "anchor": 0.14, "long": 0.0}  # drawn; rejections shift the kept shares a little
LONG_GAP = (300, 1_500)  # "long" kind: tokens of chat between the last statement and the first question
LONG_MAX_TOKENS = 1_950  # a long dialogue fits one row of --seq-len 2048
LONG_NOT_TOLD_SHARE = 0.5
DOC_RECORDS = 400  # --long-doc: pieces of prose a mix's pasted gaps draw from
HORIZON = 1_024  # the default's recall horizon (settings.json's recall_measured): older turns come back in a block
NOT_TOLD_SHARE = 0.33
FRESH_ANCHOR_SHARE = 0.4  # of the anchor dialogues: a fresh chat with requests only, nothing stated
TEXT_CHARS = 560  # a plain-text record: about 130 tokens of the Python reference's prose
NEAR_SHARE = 0.5  # of the never-given questions: a kind that was given
RECALL_DISTANCE = (2_000, 20_000)  # tokens ago the recalled statements were said (beyond any window)
BLOCK_BUDGET = 128  # tokens: `rule.block_budget` of the default model (half its 256-token window)
UPDATE_LEADS = ("Actually, that changed. ", "Small correction: ", "Update on what I said: ", "Scratch what I told you before. ",
                "Oh, it's different now. ")

Message = dict[str, Any]


def tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def size(msgs: Sequence[Message]) -> int:
    """Estimated tokens of a dialogue, template tokens (~5 a message) included."""
    return sum(tokens(m["content"]) + 5 for m in msgs)


def _value(rng: random.Random, kind: str, taken: set[str]) -> str:
    for _ in range(100):
        v = make_value(rng, kind, TRAIN_VALUES)
        if v not in taken:
            taken.add(v)
            return v
    raise ValueError(f"no fresh value of kind {kind!r}")


def _pick(rng: random.Random, concepts: Sequence[TrainConcept], k: int) -> list[TrainConcept]:
    """k distinct concepts, often two of the same kind (so the answer must match the question)."""
    first = rng.choice(concepts)
    out = [first]
    while len(out) < k:
        same = [c for c in concepts if c.kind == out[-1].kind and c not in out]
        c = rng.choice(same if same and rng.random() < 0.5 else list(concepts))
        if c not in out:
            out.append(c)
    return out


def _even_pair(rng: random.Random, concepts: Sequence[TrainConcept], k: int) -> list[TrainConcept] | None:
    """k distinct concepts whose first two share a kind, that kind drawn evenly over the kinds
    with two or more concepts (`_pick` draws in proportion to how many each has); None when
    no kind has two."""
    kinds = sorted({c.kind for c in concepts if sum(d.kind == c.kind for d in concepts) >= 2})
    if not kinds:
        return None
    kind = rng.choice(kinds)
    out = rng.sample([c for c in concepts if c.kind == kind], 2)
    rest = [c for c in concepts if c not in out]
    return out + rng.sample(rest, min(k - 2, len(rest)))


class _Talk:
    """Small talk drawn without repeats within a dialogue (weight 0: context, not targets)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.pool = rng, list(SMALL_TALK)
        rng.shuffle(self.pool)

    def turns(self, n: int) -> list[Message]:
        out: list[Message] = []
        for _ in range(n):
            if self.pool:
                u, a = self.pool.pop()
                out += [{"role": "user", "content": u}, {"role": "assistant", "content": a, "weight": 0}]
        return out

    def gap(self, target: int) -> list[Message]:
        """Small talk of about `target` tokens (whole exchanges; 0 gives none)."""
        out: list[Message] = []
        while self.pool and size(out) < target:
            out += self.turns(1)
        return out


def _sentence(rng: random.Random) -> str:
    n1, n2 = rng.sample(CHATTER_NOUNS, 2)
    adj = rng.choice((*CHATTER_ADJECTIVES, *TRAIN_VALUES["color"]))
    if rng.random() < 0.25:
        adj = f"{adj} number {rng.randint(2, 99)}"
    return f"The {adj} {n1} {rng.choice(CHATTER_VERBS)} the {n2}."


def chatter(rng: random.Random) -> tuple[str, str]:
    """A made-up (user, assistant) exchange that names things, colors, numbers and people and
    states no detail of the user's."""
    fill = {"name": rng.choice(TRAIN_VALUES["person"]), "topic": rng.choice(CHATTER_TOPICS)}
    user = rng.choice(CHATTER_ASKS).format(sentence=_sentence(rng), **fill)
    reply = rng.choice(CHATTER_REPLIES)
    while "{sentence}" in reply:
        reply = reply.replace("{sentence}", _sentence(rng), 1)
    return user, reply.format(**fill)


def _long_chat(rng: random.Random, talk: _Talk, anchors: Sequence[tuple[str, str]], target: int,
               avoid: Sequence[str]) -> list[Message]:
    """About `target` tokens of chat (weight 0): small talk while it lasts, anchors' exchanges
    and `chatter`, none naming a value in `avoid` (the details stated)."""
    out: list[Message] = []
    while size(out) < target:
        r = rng.random()
        if r < 0.2 and talk.pool:
            out += talk.turns(1)
            continue
        u, a = rng.choice(anchors) if r < 0.45 and anchors else chatter(rng)
        if any(mentions(u + " " + a, v) for v in avoid):
            continue
        out += [{"role": "user", "content": u}, {"role": "assistant", "content": a, "weight": 0}]
    return out


DOC_LEADS = ("Here's something I'm reading:", "Keep this passage handy:", "Pasting a section from the docs:",
             "This is the text I'm working through:", "More of the document:")
DOC_ACKS = ("Thanks, I've read it.", "Got it.", "Okay, I have the passage.", "Noted.", "Sure, go on.")


def _doc_chat(rng: random.Random, docs: Sequence[str], target: int, avoid: Sequence[str]) -> list[Message]:
    """About `target` tokens of pasted prose (weight 0): user turns of one or two `docs`
    pieces, none naming a value in `avoid`, each acknowledged in a word or two."""
    usable = [d for d in docs if not any(mentions(d, v) for v in avoid)]
    out: list[Message] = []
    while usable and size(out) < target:
        body = "\n\n".join(rng.sample(usable, min(len(usable), rng.choice((1, 2)))))
        out += [{"role": "user", "content": f"{rng.choice(DOC_LEADS)}\n\n{body}"},
                {"role": "assistant", "content": rng.choice(DOC_ACKS), "weight": 0}]
    return out


def _block(question: str, cands: Sequence[Candidate], horizon: int) -> str:
    """The recall block chat folds before `question` (the real rule and formatter), or ""."""
    chosen = select(question, cands, horizon=horizon, budget=BLOCK_BUDGET, count=tokens)
    return render(chosen) if chosen else ""


def _long(rng: random.Random, concepts: Sequence[TrainConcept], anchors: Sequence[tuple[str, str]], near: float,
          gap: tuple[int, int], horizon: int, doc: float = 0.0, docs: Sequence[str] = ()) -> list[Message] | None:
    """A "long" dialogue (see the module docstring); None when a block would not hold an
    answer the reply gives. A share `doc` pass the last gap as pasted `docs` (0 draws
    exactly as before)."""
    talk = _Talk(rng)
    msgs: list[Message] = [{"role": "system", "content": ""}]
    taken: set[str] = set()
    stated = _pick(rng, concepts, rng.choice((1, 2, 2, 3)))
    facts = {c.name: (c, _value(rng, c.kind, taken)) for c in stated}
    msgs += talk.turns(rng.choice((0, 1)))
    values = [v for _, v in facts.values()]
    for c, v in facts.values():
        msgs += [{"role": "user", "content": say(rng.choice(c.statements), v)},
                 {"role": "assistant", "content": rng.choice(ACKS), "weight": 0}]
        msgs += _long_chat(rng, talk, anchors, rng.choice((0, 0, 40)), values)
    if doc and rng.random() < doc:
        msgs += _doc_chat(rng, docs, rng.randint(*gap), values)
    else:
        msgs += _long_chat(rng, talk, anchors, rng.randint(*gap), values)
    for c, v in _questions(rng, concepts, facts, LONG_NOT_TOLD_SHARE, near)[:2]:
        q = rng.choice(c.questions)
        # The turns chat would consider for a block: every earlier message but the system's,
        # with how many tokens ago it ended.
        cands, ago = [], 0
        for i in range(len(msgs) - 1, 0, -1):
            if msgs[i]["role"] in ("user", "assistant"):
                cands.append(Candidate(i, msgs[i]["role"], msgs[i]["content"], ago))
            ago += tokens(msgs[i]["content"]) + 4
        block = _block(q, cands, horizon)
        if v is not None:
            said_at = max(cd.distance for cd in cands if cd.role == "user" and mentions(cd.text, v))
            if said_at > horizon and not mentions(block, v):
                return None  # past the horizon the block is the only way back, and it did not bring it
        if block:
            msgs.append({"role": BLOCK_ROLE, "content": block})
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": _answer(rng, c, v)}]
    return msgs


def _questions(rng: random.Random, concepts: Sequence[TrainConcept], facts: dict[str, tuple[TrainConcept, str]],
               not_told: float, near: float) -> list[tuple[TrainConcept, str | None]]:
    """One to three (concept, value or None for never given) to ask."""
    given = {c.kind for c, _ in facts.values()}
    never = [c for c in concepts if c.name not in facts]
    asks: list[tuple[TrainConcept, str | None]] = []
    for _ in range(rng.choice((1, 2, 2, 3))):
        if never and rng.random() < not_told:
            close = [c for c in never if c.kind in given]
            c = rng.choice(close if close and rng.random() < near else never)
            never.remove(c)
            asks.append((c, None))
        else:
            asks.append(rng.choice(list(facts.values())))
    return asks


def _answer(rng: random.Random, c: TrainConcept, v: str | None) -> str:
    return say(rng.choice(c.answers), v) if v is not None else rng.choice(c.not_told)


def _after(block: str, old: str, new: str) -> bool:
    """Whether the superseded value `old` in a block is followed by its update `new`."""
    low = block.lower()
    return mentions(block, new) and low.rfind(new.lower()) > low.rfind(old.lower())


def _update_line(rng: random.Random, c: TrainConcept, v: str) -> str:
    return rng.choice(UPDATE_LEADS) + say(rng.choice(c.statements), v)


def _edge_order(said: list[tuple[TrainConcept, str, str]], asks: list[tuple[TrainConcept, str | None]], rival_first: bool = False
                ) -> tuple[list[tuple[TrainConcept, str, str]], list[tuple[TrainConcept, str | None]]] | None:
    """The statements and questions of an edge-rival draw: the first asked detail that has a
    stated rival of the same kind is stated first and asked first, its rival stated last
    (nearest the question); with `rival_first`, the rival is stated first and the asked
    detail last. None when no asked detail has a rival."""
    for j, (c, v) in enumerate(asks):
        rivals = [st for st in said if st[0].kind == c.kind and st[0].name != c.name]
        if v is None or not rivals:
            continue
        first = next(st for st in said if st[0].name == c.name)
        middle = [st for st in said if st is not first and st is not rivals[0]]
        order = [rivals[0], *middle, first] if rival_first else [first, *middle, rivals[0]]
        return order, [asks[j], *asks[:j], *asks[j + 1:]]
    return None


def dialogue(rng: random.Random, kind: str, concepts: Sequence[TrainConcept], *, not_told: float = NOT_TOLD_SHARE,
             near: float = NEAR_SHARE, anchors: Sequence[tuple[str, str]] = (), gap: tuple[int, int] = GAP_TOKENS,
             anchor_details: int = 1, long_gap: tuple[int, int] = LONG_GAP, horizon: int = HORIZON,
             gap_chatter: float = 0.0, reach: int = WINDOW_REACH, edge_rival: float = 0.0,
             rival_first: float = 0.0, even_pairs: float = 0.0, long_doc: float = 0.0,
             docs: Sequence[str] = ()) -> list[Message] | None:
    """One dialogue of `kind` ("window", "recall", "update", "anchor" or "long"); None when a recall
    block would not hold an answer the reply gives (the caller draws again). An anchor that
    is not a fresh chat states 1 to `anchor_details` details before its everyday request. A
    share `gap_chatter` of the window and update dialogues fill their gap with `chatter` and
    small talk instead of small talk alone (0 draws exactly as before). A detail asked about
    in the window kinds was stated at most `reach` tokens before its question. A share
    `edge_rival` of the window dialogues that state two details of the same kind and ask one
    state the asked one first, at the edge of the reach, and its rival last, nearer the
    question; a share `rival_first` of those state the rival first and the asked one last,
    at the edge (0 and 0 draw exactly as before). A share `even_pairs` of the window dialogues
    state two details of one kind, the kind drawn evenly over the kinds (`_even_pair`), and ask
    the first of them (0 draws exactly as before). A share `long_doc` of the long dialogues
    pass their gap as pasted `docs`."""
    if kind == "long":
        return _long(rng, concepts, anchors, near, long_gap, horizon, long_doc, docs)
    talk = _Talk(rng)
    msgs: list[Message] = [{"role": "system", "content": ""}]
    taken: set[str] = set()
    if kind == "anchor" and rng.random() < FRESH_ANCHOR_SHARE:
        # A fresh chat that states nothing and asks nothing: one or two everyday requests
        # answered as the teacher answers them (a plain question is never "not told").
        drawn = rng.sample(list(anchors), rng.choice((1, 1, 2)))
        for req, reply in dict(drawn).items():  # a weighted social anchor may be drawn twice: ask it once
            msgs += [{"role": "user", "content": req}, {"role": "assistant", "content": reply}]
        return msgs
    if kind == "anchor":
        k = rng.randint(1, anchor_details) if anchor_details > 1 else 1  # 1: draws as mix3c's did
    else:
        k = rng.choice((1, 2, 2, 3, 4))
    pair = kind == "window" and even_pairs and rng.random() < even_pairs and \
        _even_pair(rng, concepts, rng.choice((2, 2, 3, 4)))
    stated = pair or _pick(rng, concepts, k)
    facts = {c.name: (c, _value(rng, c.kind, taken)) for c in stated}
    # The statements, in order, as (concept, value, text); an update restates one later.
    said: list[tuple[TrainConcept, str, str]] = [(c, v, say(rng.choice(c.statements), v)) for c, v in facts.values()]
    if kind == "update":
        c, _ = rng.choice(list(facts.values()))
        new = _value(rng, c.kind, taken)
        said.append((c, new, _update_line(rng, c, new)))
        old = facts[c.name][1]
        facts[c.name] = (c, new)
    else:
        old = new = None
    asks = _questions(rng, concepts, facts, not_told, near)
    if kind == "update" and not any(v is not None and a.name == said[-1][0].name for a, v in asks):
        asks.insert(0, facts[said[-1][0].name])  # the updated detail is always asked
    if pair and not any(v is not None and a.name in (pair[0].name, pair[1].name) for a, v in asks):
        asks.insert(0, facts[pair[0].name])  # one of the pair is always asked
    recall = kind == "recall" or (kind == "update" and rng.random() < 0.4)
    if recall:
        # Long ago: the statements are not in this dialogue, only in what the block brings back.
        far = rng.randint(*RECALL_DISTANCE)
        earlier = []
        for i, (_, _, text) in enumerate(said):
            earlier += [("user", text), ("assistant", rng.choice(ACKS))]
            earlier += [(m["role"], m["content"]) for m in talk.turns(rng.choice((0, 1)))]
        cands = [Candidate(i, role, text, far - 40 * i) for i, (role, text) in enumerate(earlier)]
        msgs += talk.turns(rng.choice((0, 1, 2)))
        for c, v in asks:
            q = rng.choice(c.questions)
            block = _block(q, cands, 0)
            if (v is not None and not mentions(block, v)) or (old is not None and mentions(block, old) and not _after(block, old, new)):
                # The rule did not bring the answer back, or brought back a superseded value
                # without its update: no reply could be right. Draw again.
                return None
            if block:
                msgs.append({"role": BLOCK_ROLE, "content": block})
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": _answer(rng, c, v)}]
            msgs += talk.turns(rng.choice((0, 0, 1)))
        return msgs if any(m["role"] == BLOCK_ROLE for m in msgs) else None  # no block: not this kind
    edge = kind == "window" and edge_rival and rng.random() < edge_rival and \
        _edge_order(said, asks, bool(rival_first) and rng.random() < rival_first)
    if edge:
        said, asks = edge
    msgs += talk.turns(rng.choice((0, 1)))
    where: dict[str, int] = {}  # concept -> estimated token position where its (latest) statement starts
    for i, (c, _, text) in enumerate(said):
        where[c.name] = size(msgs)
        msgs += [{"role": "user", "content": text}, {"role": "assistant", "content": rng.choice(ACKS), "weight": 0}]
        if i < len(said) - 1:
            msgs += talk.turns(rng.choice((0, 0, 1)))
    if kind == "anchor":
        req, reply = rng.choice(anchors)
        msgs += [{"role": "user", "content": req}, {"role": "assistant", "content": reply}]
        asks = asks[:1]
    else:
        chat = gap_chatter and rng.random() < gap_chatter
        if edge:  # as far as the reach allows: the asked detail at the edge, its rival nearer (or, rival first, farther)
            room = reach - (size(msgs) - where[asks[0][0].name])
            target = max(0, room - rng.randint(*EDGE_SLACK))
        else:
            target = rng.randint(*gap)
        if chat:
            msgs += _long_chat(rng, talk, (), target, [v for _, v, _ in said])
        else:
            msgs += talk.gap(target)
    for c, v in asks:
        if v is not None and size(msgs) - where[c.name] > reach:
            return None  # the statement would have left the window: that is the "recall" kind's case
        msgs += [{"role": "user", "content": rng.choice(c.questions)}, {"role": "assistant", "content": _answer(rng, c, v)}]
        msgs += talk.turns(rng.choice((0, 0, 1)))
    return msgs


def dialogues(n: int, seed: int, concepts: Sequence[TrainConcept], anchors: Sequence[tuple[str, str]] = (), *,
              shares: dict[str, float] | None = None, not_told: float = NOT_TOLD_SHARE, near: float = NEAR_SHARE,
              gap: tuple[int, int] = GAP_TOKENS, anchor_details: int = 1, long_gap: tuple[int, int] = LONG_GAP,
              horizon: int = HORIZON, gap_chatter: float = 0.0, reach: int = WINDOW_REACH,
              edge_rival: float = 0.0, rival_first: float = 0.0, even_pairs: float = 0.0,
              long_doc: float = 0.0) -> list[tuple[str, list[Message]]]:
    """`n` (kind, dialogue) pairs within `MAX_TOKENS` (`LONG_MAX_TOKENS` for "long"; longer
    draws are drawn again); no "anchor" kind without anchors, none of a kind of share 0."""
    rng = random.Random(f"answer-mix/{seed}")
    shares = dict(shares or KIND_SHARES)
    if not anchors:
        shares.pop("anchor", None)
    shares = {k: w for k, w in shares.items() if w > 0}
    kinds, weights = list(shares), list(shares.values())
    docs = text_records(DOC_RECORDS, seed + 7) if long_doc and "long" in shares else []
    out: list[tuple[str, list[Message]]] = []
    while len(out) < n:
        kind = rng.choices(kinds, weights)[0]
        msgs = dialogue(rng, kind, concepts, not_told=not_told, near=near, anchors=anchors, gap=gap,
                        anchor_details=anchor_details, long_gap=long_gap, horizon=horizon, gap_chatter=gap_chatter, reach=reach,
                        edge_rival=edge_rival, rival_first=rival_first, even_pairs=even_pairs, long_doc=long_doc, docs=docs)
        if msgs is not None and size(msgs) <= (LONG_MAX_TOKENS if kind == "long" else MAX_TOKENS):
            out.append((kind, msgs))
    return out


def held_out_words() -> set[str]:
    """The value words of `laplace probe natural` and of the second held-out set (names,
    places, foods, colors, jobs, weekdays, words; numbers are drawn fresh, never listed)."""
    from agent.probes.natural_text import HELDOUT_VALUES
    from recipes.answer.heldout2 import HELDOUT2_VALUES

    return {v.lower() for pools in (HELDOUT_VALUES, HELDOUT2_VALUES) for kind, vs in pools.items()
            if kind not in ("month", "time24") for v in vs}


def clean_anchors(anchors: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Anchors whose request and reply hold no held-out value: a teacher reply that happens
    to name a probe's city ("Kyoto") would put that value in training."""
    held = held_out_words()
    return [(q, a) for q, a in anchors if not any(mentions(q + " " + a, v) for v in held)]


def text_records(n: int, seed: int) -> list[str]:
    """`n` pieces of plain prose of about `TEXT_CHARS` characters (whole paragraphs where they
    fit) from the Python language reference that the standard library ships for help()
    (`pydoc_data.topics`): trained as plain text, they hold the model's reading of prose
    that is not chat. Not the docstrings that `recipes.answer.check` measures perplexity on."""
    from recipes.smollm2_hybrid.text import reference_text

    pieces, cur = [], ""
    for para in reference_text(10**9).split("\n\n"):
        para = para.strip()
        if not para:
            continue
        if cur and len(cur) + len(para) > TEXT_CHARS:
            pieces.append(cur)
            cur = ""
        cur = (cur + "\n\n" + para) if cur else para[: 2 * TEXT_CHARS]
    if cur:
        pieces.append(cur)
    held = held_out_words()  # a piece that names a held-out value ("green", "Friday") is left out
    pieces = [p for p in dict.fromkeys(pieces) if len(p) >= TEXT_CHARS // 4 and not any(mentions(p, v) for v in held)]
    random.Random(f"answer-text/{seed}").shuffle(pieces)
    return pieces[:n]


# A reply that answers as "a chatbot" ("as a chatbot designed to assist with digital
# communication, I don't have the capability to access internet"): the teacher's words for
# some social requests. Weighted up in run I, they came back for a never-given "How do I get
# on the wifi?" (refresh on, 2,048 tokens: 4 of 26), so they are not weighted.
DISCLAIMS = re.compile(r"\bas an? (?:text-based )?(?:ai|chatbot|language model)\b", re.I)


def weighted_social(anchors: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """The social anchors (a request in `SOCIAL_REQUESTS`) `--social-weight` draws more often:
    those whose reply does not disclaim as a chatbot (`DISCLAIMS`)."""
    social = set(SOCIAL_REQUESTS)
    return {(q, a) for q, a in anchors if q in social and not DISCLAIMS.search(a)}


def weigh_social(anchors: Sequence[tuple[str, str]], weight: int) -> list[tuple[str, str]]:
    """`anchors` with each of `weighted_social` listed `weight` times, so it is drawn
    `weight` times as often; weight 1 is `anchors` as given."""
    heavy = weighted_social(anchors)
    return [pair for pair in anchors for _ in range(weight if pair in heavy else 1)]


def unknown_concepts(names: Sequence[str]) -> list[str]:
    """Those of `names` that name no training concept, sorted."""
    return sorted(set(names) - {c.name for c in TRAIN_CONCEPTS})


def write(out: Path, *, train: int, eval_n: int, seed: int, anchors: Sequence[tuple[str, str]] = (), text: int = 0,
          social_weight: int = 1, without: Sequence[str] = (), **mix: Any) -> dict[str, Any]:
    """DIR/train.jsonl (+ `text` plain-text records), DIR/eval.jsonl and DIR/stats.json.
    `without` names training concepts to leave out (a mix drawn before they were added)."""
    unknown = unknown_concepts(without)
    if unknown:
        raise ValueError(f"no training concept named {', '.join(unknown)}")
    train_concepts = tuple(c for c in TRAIN_CONCEPTS if c.name not in set(without))
    out.mkdir(parents=True, exist_ok=True)
    given = len(anchors)
    anchors = clean_anchors(anchors)
    stats: dict[str, Any] = {"seed": seed, "anchors": len(anchors), "anchors_dropped_for_held_out_values": given - len(anchors)}
    if without:
        stats["without"] = sorted(without)
    if social_weight != 1:
        stats["social_anchors"] = len(set(SOCIAL_REQUESTS) & {q for q, _ in anchors})
        stats["social_anchors_weighted"] = len(weighted_social(anchors))
        stats["social_weight"] = social_weight
        anchors = weigh_social(anchors, social_weight)
    for name, n, concepts, s, anc in (("train", train, train_concepts, seed, anchors), ("eval", eval_n, EVAL_CONCEPTS, seed + 1_000_000, ())):
        rows = dialogues(n, s, concepts, anc, **mix)
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for _, msgs in rows:
                f.write(json.dumps({"messages": msgs}) + "\n")
            if name == "train" and text:
                pieces = text_records(text, seed)
                for piece in pieces:
                    f.write(json.dumps({"text": piece}) + "\n")
                stats["text_records"] = len(pieces)
        stats[name] = {"dialogues": n, "kinds": dict(Counter(k for k, _ in rows)),
                       "est_tokens": sum(size(m) for _, m in rows)}
    (out / "stats.json").write_text(json.dumps(stats, indent=2), encoding="utf-8")
    return stats


def _span(ap: argparse.ArgumentParser, option: str, text: str, least: int, most: int, rule: str,
          example: str) -> tuple[int, int]:
    """`text` as LO,HI tokens with least <= LO <= HI <= most; otherwise the parser's error
    (exit 2) naming `option`, the `rule` and an `example`."""
    try:
        lo, hi = (int(x) for x in text.split(","))
        if least <= lo <= hi <= most:
            return lo, hi
    except ValueError:
        pass
    ap.error(f"{option} {text!r}: give LO,HI in tokens with {rule}, e.g. {option} {example}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train", type=int, default=4000)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anchors", type=Path, help="recipes/answer/teacher.py's replies (JSONL)")
    ap.add_argument("--not-told-share", type=float, default=NOT_TOLD_SHARE)
    ap.add_argument("--near-share", type=float, default=NEAR_SHARE)
    ap.add_argument("--anchor-share", type=float, default=KIND_SHARES["anchor"],
                    help=f"share of anchor dialogues (default {KIND_SHARES['anchor']}; {FRESH_ANCHOR_SHARE * 100:.0f}%% of them fresh chats)")
    ap.add_argument("--text", type=int, default=0, metavar="N",
                    help="add N plain-text records of the Python reference's prose to train.jsonl (0: none)")
    ap.add_argument("--window-share", type=float, default=KIND_SHARES["window"], help="share of window dialogues")
    ap.add_argument("--gap", default=f"{GAP_TOKENS[0]},{GAP_TOKENS[1]}", metavar="LO,HI",
                    help=f"tokens of small talk between the statements and the first question in window dialogues (default {GAP_TOKENS[0]},{GAP_TOKENS[1]})")
    ap.add_argument("--long-share", type=float, default=KIND_SHARES["long"],
                    help="share of long dialogues, whose statements have left the window (default 0; train them with --seq-len 2048)")
    ap.add_argument("--long-gap", default=f"{LONG_GAP[0]},{LONG_GAP[1]}", metavar="LO,HI",
                    help=f"tokens of chat before the questions of long dialogues (default {LONG_GAP[0]},{LONG_GAP[1]})")
    ap.add_argument("--long-doc", type=float, default=0.0, metavar="P",
                    help="share of long dialogues whose gap is pasted prose (pieces of the Python reference) instead of chat "
                         "(default 0)")
    ap.add_argument("--horizon", type=int, default=HORIZON,
                    help=f"long dialogues: statements older than this many tokens come back in a recall block (default {HORIZON}, the default model's)")
    ap.add_argument("--gap-chatter", type=float, default=0.0, metavar="P",
                    help="share of window and update dialogues whose gap is made-up chatter that names things, colors, "
                         "numbers and people, with small talk, instead of small talk alone (default 0)")
    ap.add_argument("--anchor-details", type=int, default=1, metavar="K",
                    help="an anchor that is not a fresh chat states 1 to K details before its request (default 1)")
    ap.add_argument("--social-weight", type=int, default=1, metavar="K",
                    help="draw each social anchor (a greeting, thanks, a question about the assistant) K times as often as "
                         "the others (default 1)")
    ap.add_argument("--reach", type=int, default=WINDOW_REACH, metavar="N",
                    help=f"window kinds: a detail asked about was stated at most N tokens before its question "
                         f"(default {WINDOW_REACH}; at most {MAX_REACH}, the edge of the 256-token window)")
    ap.add_argument("--edge-rival", type=float, default=0.0, metavar="P",
                    help="share of window dialogues with two details of the same kind that state the asked one first, "
                         "at the edge of --reach, and the other last, nearer the question (default 0)")
    ap.add_argument("--rival-first", type=float, default=0.0, metavar="F",
                    help="share of the --edge-rival draws that state the other detail first and the asked one last, "
                         "at the edge of --reach (default 0)")
    ap.add_argument("--even-pairs", type=float, default=0.0, metavar="P",
                    help="share of window dialogues that state two details of one kind, the kind drawn evenly over the "
                         "kinds, and ask one of them (default 0; with --edge-rival they go to the edge)")
    ap.add_argument("--without", default="", metavar="NAMES",
                    help="leave out these training concepts, comma-separated, to draw the mix of a run from before they "
                         "were added (run J's: --without bake_sale,choir,craft_market)")
    a = ap.parse_args(argv)
    without = [n.strip() for n in a.without.split(",") if n.strip()]
    unknown = unknown_concepts(without)
    if unknown:
        ap.error(f"--without {','.join(unknown)}: no such training concept; "
                 f"the names are {', '.join(c.name for c in TRAIN_CONCEPTS)}")
    if not 1 <= a.social_weight <= 20:
        ap.error(f"--social-weight {a.social_weight}: give a whole number from 1 to 20")
    if not 1 <= a.anchor_details <= 4:
        ap.error(f"--anchor-details {a.anchor_details}: give 1 to 4")
    if not 0 < a.reach <= MAX_REACH:
        ap.error(f"--reach {a.reach}: give a number of tokens from 1 to {MAX_REACH}")
    lo, hi = _span(ap, "--gap", a.gap, 0, a.reach, f"0 <= LO <= HI <= --reach ({a.reach})", "60,200")
    llo, lhi = _span(ap, "--long-gap", a.long_gap, WINDOW_REACH + 1, LONG_GAP[1],
                     f"{WINDOW_REACH} < LO <= HI <= {LONG_GAP[1]}", "300,1500")
    if not 0 <= a.gap_chatter <= 1:
        ap.error(f"--gap-chatter {a.gap_chatter}: give a share from 0 to 1")
    if not 0 <= a.edge_rival <= 1:
        ap.error(f"--edge-rival {a.edge_rival}: give a share from 0 to 1")
    if not 0 <= a.rival_first <= 1:
        ap.error(f"--rival-first {a.rival_first}: give a share from 0 to 1")
    if a.rival_first and not a.edge_rival:
        ap.error(f"--rival-first {a.rival_first} turns round --edge-rival draws: give --edge-rival P too")
    if not 0 <= a.even_pairs <= 1:
        ap.error(f"--even-pairs {a.even_pairs}: give a share from 0 to 1")
    if not 0 <= a.long_doc <= 1:
        ap.error(f"--long-doc {a.long_doc}: give a share from 0 to 1")
    if a.long_doc and not a.long_share:
        ap.error(f"--long-doc {a.long_doc} passes the gap of long dialogues as prose: give --long-share P too")
    if a.horizon < 0:
        ap.error(f"--horizon {a.horizon}: give a number of tokens >= 0")
    shares = {**KIND_SHARES, "anchor": a.anchor_share, "window": a.window_share, "long": a.long_share}
    print(json.dumps(write(a.out, train=a.train, eval_n=a.eval, seed=a.seed, anchors=read_anchors(a.anchors),
                           not_told=a.not_told_share, near=a.near_share, shares=shares, text=a.text,
                           gap=(lo, hi), anchor_details=a.anchor_details, long_gap=(llo, lhi), horizon=a.horizon,
                           gap_chatter=a.gap_chatter, social_weight=a.social_weight, without=without, reach=a.reach,
                           edge_rival=a.edge_rival, rival_first=a.rival_first, even_pairs=a.even_pairs,
                           long_doc=a.long_doc)))


if __name__ == "__main__":
    main()
