"""Ask a measured trial again with one thing changed, to see which line the model reads when
it answers (or misses) a detail.

    python -m recipes.answer.ablate -m MODEL_DIR [--delta D] [--set heldout2] --distance 200 --trials 84 T [T ...] [--out r.json]

`T` are trial numbers as `recipes.answer.measure` numbers its rows (same seed, distance and
trial count, so trial T is that row's conversation). For each, one greedy reply to:
- the conversation as measured;
- each other detail's statement replaced by `NEUTRAL`, a line that states nothing (the
  conversation keeps every other token, so a miss that goes away was that statement's doing);
- the asked statement and the last other one swapped (the same tokens in another order);
- the small talk after the statements cut at every second message boundary (the same
  statements nearer the question).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from agent.probes.natural import Conversation, _ask, _read, build_conversation, plan, score_stated
from agent.probes.natural_text import mentions
from recipes.answer.measure import concept_set, load_tuned

NEUTRAL = "I went for a long walk by the river this morning."


def rebuild(lm, c: Conversation, said: list[tuple[str, str, int]], pieces: tuple = ()) -> Conversation:  # type: ignore[no-untyped-def]
    """`c` with these statement turns and this small talk, the token ids made again."""
    tok, tpl = lm.tokenizer, lm.template
    ids = list(tpl.message(tok, "system", "", first=True))
    turns = []
    for role, body, _ in said:
        m = tpl.message(tok, role, body)
        turns.append((role, body, len(m)))
        ids += m
    for p in pieces:
        ids += tpl.message(tok, p.role, p.text)
    return dataclasses.replace(c, ids=ids, said=tuple(turns), pieces=tuple(pieces),
                               filler_tokens=pieces[-1].end if pieces else 0)


def variants(lm, c: Conversation) -> list[tuple[str, Conversation]]:  # type: ignore[no-untyped-def]
    """(label, conversation) for the trial as measured and each change named in the module's doc."""
    said = list(c.said)
    users = [i for i, (role, _, _) in enumerate(said) if role == "user"]
    asked = next(i for i in users if mentions(said[i][1], c.value))
    others = [i for i in users if i != asked]
    out = [("as measured", c)]
    for o in others:
        out.append((f"neutral for {said[o][1]!r}", rebuild(lm, c, [*said[:o], ("user", NEUTRAL, 0), *said[o + 1:]], c.pieces)))
    if others:
        swapped = list(said)
        swapped[asked], swapped[others[-1]] = said[others[-1]], said[asked]
        out.append(("asked and last other swapped", rebuild(lm, c, swapped, c.pieces)))
    bare = len(rebuild(lm, c, said).ids)
    for k in range(0, len(c.pieces), 2):
        cut = rebuild(lm, c, said, c.pieces[:k])
        out.append((f"small talk cut to {len(cut.ids) - bare} tokens", cut))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--delta")
    ap.add_argument("--distance", type=int, default=200)
    ap.add_argument("--trials", type=int, default=84)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", choices=("probe", "heldout2"), default="heldout2")
    ap.add_argument("--out", type=Path)
    ap.add_argument("trial", type=int, nargs="+", help="trial numbers, as recipes.answer.measure numbers its rows")
    a = ap.parse_args(argv)
    bad = [t for t in a.trial if not 0 <= t < a.trials]
    if bad:
        ap.error(f"trial {bad[0]}: give a trial number from 0 to {a.trials - 1} (--trials {a.trials})")
    torch.set_num_threads(2)
    lm = load_tuned(a.model, a.delta)
    with concept_set(a.set):
        chosen = plan(a.seed, a.distance, a.trials)
        asked = [(t, label, v) for t in a.trial
                 for label, v in variants(lm, build_conversation(lm, chosen[t], a.seed, a.distance, t))]
        convs = [v for *_, v in asked]
        replies, _, _ = _ask(lm, _read(lm, convs), convs, None)
    rows = [{"trial": t, "concept": c.concept.name, "value": c.value, "question": c.question, "variant": label,
             "reply": reply, "kind": score_stated(reply, c.value)} for (t, label, c), (reply, _) in zip(asked, replies)]
    for r in rows:
        print(f"{r['trial']} {r['value']} | {r['variant']} -> {r['reply']} [{r['kind']}]")
    if a.out:
        a.out.write_text(json.dumps({"model": a.model, "delta": a.delta, "set": a.set, "distance": a.distance,
                                     "trials": a.trials, "rows": rows}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
