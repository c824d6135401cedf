"""Seeded dialogues for the answer delta: the user states details in plain speech among
small talk, later asks, and the assistant answers from the conversation or says it was not
told. Written as `laplace finetune` chat JSONL; ships no external data.

    python -m recipes.answer.dialogues --out DIR [--train 1200] [--eval 64] [--seed 0]

writes DIR/train.jsonl (concepts of `concepts.TRAIN_CONCEPTS`) and DIR/eval.jsonl (the
held-out `EVAL_CONCEPTS` only). Every dialogue opens with an empty system turn, as a
session of the chat service does, and stays short enough for one training row
(`MAX_CHARS`), so a question never loses the statement it asks about to a row cut.

Only the answers are learned: acknowledgements and small-talk replies carry `"weight": 0`
(context, not targets). Trained on, they taught the model to answer requests with
"Noted." and to reuse the canned small-talk lines (the first run's general-chat check).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any, Sequence

from agent.probes.natural_text import make_value, say
from recipes.answer.concepts import ACKS, EVAL_CONCEPTS, SMALL_TALK, TRAIN_CONCEPTS, TRAIN_VALUES, TrainConcept

MAX_CHARS = 900  # sum of (content + 20) over messages: about 256 SmolLM2 tokens at most; train with --seq-len 256 --pack rows
NOT_TOLD_SHARE = 0.45  # questions about a detail never given
ANCHOR_SHARE = 0.3  # with --anchors: dialogues that carry a request answered in the base model's words
NEAR_SHARE = 0.7  # of those, how many ask a kind of detail that was given (a person's name, a number)


def _value(rng: random.Random, kind: str, taken: set[str]) -> str:
    for _ in range(100):
        v = make_value(rng, kind, TRAIN_VALUES)
        if v not in taken:
            return v
    raise ValueError(f"no fresh value of kind {kind!r}")


def dialogue(rng: random.Random, concepts: Sequence[TrainConcept], *, not_told: float = NOT_TOLD_SHARE,
             near_share: float = NEAR_SHARE) -> list[dict[str, Any]]:
    """One dialogue as chat messages."""
    k = rng.choice((1, 1, 2, 2, 3))
    first = rng.choice(concepts)
    # Often a second detail of the same kind, so the answer must match what was asked.
    same = [c for c in concepts if c.kind == first.kind and c is not first]
    stated = [first]
    while len(stated) < k:
        pool = same if same and rng.random() < 0.5 else list(concepts)
        c = rng.choice(pool)
        if c not in stated:
            stated.append(c)
    taken: set[str] = set()
    facts = []
    for c in stated:
        v = _value(rng, c.kind, taken)
        taken.add(v)
        facts.append((c, v))
    talk = list(SMALL_TALK)
    rng.shuffle(talk)
    msgs: list[dict[str, str]] = [{"role": "system", "content": ""}]

    def chat(n: int) -> None:
        for _ in range(n):
            if talk:
                u, a = talk.pop()
                msgs.extend(({"role": "user", "content": u}, {"role": "assistant", "content": a, "weight": 0}))

    chat(rng.choice((0, 1)))
    for c, v in facts:
        msgs.extend(({"role": "user", "content": say(rng.choice(c.statements), v)},
                     {"role": "assistant", "content": rng.choice(ACKS), "weight": 0}))
        chat(rng.choice((0, 0, 1)))
    chat(rng.choice((0, 1, 2)))
    never = [c for c in concepts if c not in stated]
    asks: list[tuple[TrainConcept, str | None]] = []
    kinds = {c.kind for c in stated}
    for _ in range(rng.choice((1, 2, 2, 3))):
        if rng.random() < not_told and never:
            # Mostly a detail of a kind that *was* given: the value said for the sister is
            # not the brother's name (the mistake the second run made on the probe).
            near = [i for i, c in enumerate(never) if c.kind in kinds]
            pick = rng.choice(near) if near and near_share > 0 and rng.random() < near_share else rng.randrange(len(never))
            asks.append((never.pop(pick), None))
        else:
            asks.append(rng.choice(facts))
    for c, v in asks:
        reply = say(rng.choice(c.answers), v) if v is not None else rng.choice(c.not_told)
        msgs.extend(({"role": "user", "content": rng.choice(c.questions)}, {"role": "assistant", "content": reply}))
        chat(rng.choice((0, 0, 1)))
    return msgs


def anchored(rng: random.Random, concepts: Sequence[TrainConcept], anchors: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """A short dialogue in which an everyday request, between a stated detail and a question,
    gets the base model's own reply (trained): requests are still answered as before, not
    taken for questions about the conversation."""
    c = rng.choice(concepts)
    v = _value(rng, c.kind, set())
    req, reply = rng.choice(anchors)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": ""},
                                  {"role": "user", "content": say(rng.choice(c.statements), v)},
                                  {"role": "assistant", "content": rng.choice(ACKS), "weight": 0},
                                  {"role": "user", "content": req}, {"role": "assistant", "content": reply}]
    if rng.random() < 0.5:
        msgs.extend(({"role": "user", "content": rng.choice(c.questions)}, {"role": "assistant", "content": say(rng.choice(c.answers), v)}))
    else:
        other = rng.choice([o for o in concepts if o is not c])
        msgs.extend(({"role": "user", "content": rng.choice(other.questions)}, {"role": "assistant", "content": rng.choice(other.not_told)}))
    return msgs


def size(msgs: list[dict[str, str]]) -> int:
    """A tokenizer-free size (`MAX_CHARS`'s unit)."""
    return sum(len(m["content"]) + 20 for m in msgs)


def dialogues(n: int, seed: int, concepts: Sequence[TrainConcept], anchors: Sequence[tuple[str, str]] = (), *,
              not_told: float = NOT_TOLD_SHARE, near_share: float = NEAR_SHARE, anchor_share: float = ANCHOR_SHARE) -> list[list[dict[str, Any]]]:
    """`n` dialogues of at most `MAX_CHARS` (longer draws are dropped and drawn again); with
    `anchors` ((request, base model's reply) pairs), `anchor_share` of them are `anchored`."""
    rng = random.Random(f"answer-dialogues/{seed}")
    out: list[list[dict[str, Any]]] = []
    while len(out) < n:
        msgs = (anchored(rng, concepts, anchors) if anchors and rng.random() < anchor_share
                else dialogue(rng, concepts, not_told=not_told, near_share=near_share))
        if size(msgs) <= MAX_CHARS:
            out.append(msgs)
    return out


def read_anchors(path: Path | None) -> list[tuple[str, str]]:
    """(request, reply) pairs written by recipes/answer/teacher.py."""
    if path is None:
        return []
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [(r["request"], r["reply"]) for r in rows if r.get("reply")]  # null: dropped (cut off or looping)


def write(out: Path, *, train: int, eval_n: int, seed: int, anchors: Sequence[tuple[str, str]] = (), **mix: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, n, concepts, s, anc in (("train", train, TRAIN_CONCEPTS, seed, anchors), ("eval", eval_n, EVAL_CONCEPTS, seed + 1_000_000, ())):
        rows = dialogues(n, s, concepts, anc, **mix)
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for msgs in rows:
                f.write(json.dumps({"messages": msgs}) + "\n")
        counts[name] = n
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--train", type=int, default=1200)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anchors", type=Path, help="recipes/answer/teacher.py's replies.jsonl (the base model's own replies)")
    ap.add_argument("--not-told-share", type=float, default=NOT_TOLD_SHARE)
    ap.add_argument("--near-share", type=float, default=NEAR_SHARE)
    ap.add_argument("--anchor-share", type=float, default=ANCHOR_SHARE)
    a = ap.parse_args(argv)
    print(json.dumps(write(a.out, train=a.train, eval_n=a.eval, seed=a.seed, anchors=read_anchors(a.anchors),
                           not_told=a.not_told_share, near_share=a.near_share, anchor_share=a.anchor_share)))


if __name__ == "__main__":
    main()
