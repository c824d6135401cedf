"""The answer recipe's dialogues: held-out phrasings never reach training, and every
assistant reply is right about what the conversation said."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent.probes.natural_text import CONCEPTS as PROBE_CONCEPTS
from agent.probes.natural_text import HELDOUT_VALUES, mentions, says_not_told
from recipes.answer.concepts import CONCEPTS, EVAL_CONCEPTS, SPLIT_HELDOUT, TRAIN_CONCEPTS, TRAIN_VALUES
from recipes.answer.dialogues import MAX_CHARS, dialogues, size, write


def _probe_phrasings() -> set[str]:
    return {p.lower() for c in PROBE_CONCEPTS for p in (*c.statements, *c.questions, *c.updates, c.answer, c.not_told)}


def _pattern(phrasing: str) -> re.Pattern[str]:
    """A statement with its value as a capture group (`say` may upper-case the first letter)."""
    return re.compile(re.escape(phrasing).replace(re.escape("{v}"), "(.+?)"), re.I)


def test_no_probe_concept_phrasing_or_value_is_trained() -> None:
    probe_names = {c.name for c in PROBE_CONCEPTS}
    assert not probe_names & {c.name for c in CONCEPTS}
    probe = _probe_phrasings()
    for c in CONCEPTS:
        for p in (*c.statements, *c.questions, *c.answers, *c.not_told):
            assert p.lower() not in probe, p
    for kind, pool in TRAIN_VALUES.items():
        assert not {v.lower() for v in pool} & {v.lower() for v in HELDOUT_VALUES.get(kind, ())}, kind


def test_generated_training_text_holds_no_held_out_phrasing(tmp_path: Path) -> None:
    write(tmp_path, train=300, eval_n=40, seed=5)
    train_text = (tmp_path / "train.jsonl").read_text(encoding="utf-8")
    msgs = [m["content"] for line in train_text.splitlines() for m in json.loads(line)["messages"]]
    held = list(EVAL_CONCEPTS)
    assert {c.name for c in held} == SPLIT_HELDOUT and not {c.name for c in TRAIN_CONCEPTS} & SPLIT_HELDOUT
    for c in held:  # the recipe's own held-out concepts: their questions never appear in training
        for q in c.questions:
            assert q not in msgs, q
    for p in PROBE_CONCEPTS:  # the probe's questions never appear either
        for q in p.questions:
            assert q not in msgs, q
    eval_msgs = {m["content"] for line in (tmp_path / "eval.jsonl").read_text().splitlines() for m in json.loads(line)["messages"]}
    assert any(q in eval_msgs for c in held for q in c.questions)


def test_every_reply_matches_what_was_said() -> None:
    """Answers carry the value stated for that concept; "not told" only for concepts never stated."""
    by_question = {q: c for c in TRAIN_CONCEPTS for q in c.questions}
    checked_answers = checked_not_told = 0
    for msgs in dialogues(200, 3, TRAIN_CONCEPTS):
        assert size(msgs) <= MAX_CHARS and msgs[0] == {"role": "system", "content": ""}
        stated: dict[str, str] = {}
        for i, m in enumerate(msgs):
            if m["role"] != "user":
                continue
            for c in TRAIN_CONCEPTS:
                for s in c.statements:
                    if hit := _pattern(s).fullmatch(m["content"]):
                        stated[c.name] = hit.group(1)
            c = by_question.get(m["content"])
            if c is None:
                continue
            reply = msgs[i + 1]["content"]
            if c.name in stated:
                assert mentions(reply, stated[c.name]) and not says_not_told(reply), (m["content"], reply, stated)
                checked_answers += 1
            else:
                assert says_not_told(reply), reply
                checked_not_told += 1
    assert checked_answers > 100 and checked_not_told > 50


def test_dialogues_are_seeded() -> None:
    assert dialogues(5, 1, TRAIN_CONCEPTS) == dialogues(5, 1, TRAIN_CONCEPTS)
    assert dialogues(5, 1, TRAIN_CONCEPTS) != dialogues(5, 2, TRAIN_CONCEPTS)


def test_only_answers_are_targets() -> None:
    """Acknowledgements and small talk are context (weight 0): trained on, they taught the
    model to answer requests with "Noted." and canned lines."""
    from recipes.answer.concepts import ACKS, SMALL_TALK

    canned = set(ACKS) | {a for _, a in SMALL_TALK}
    for msgs in dialogues(100, 4, TRAIN_CONCEPTS):
        for m in msgs:
            if m["role"] == "assistant":
                assert (m.get("weight", 1) == 0) == (m["content"] in canned), m


def test_anchor_requests_are_not_the_checks_prompts_and_are_trained() -> None:
    from recipes.answer.check import PROMPTS
    from recipes.answer.teacher import REQUESTS

    assert not set(PROMPTS) & set(REQUESTS)
    anchors = [("How do I fry an egg?", "Heat a pan, add oil, crack the egg and cook it for three minutes.")]
    rows = dialogues(60, 2, TRAIN_CONCEPTS, anchors)
    with_anchor = [m for m in rows if any(x["content"] == anchors[0][0] for x in m)]
    assert 5 < len(with_anchor) < 40
    for msgs in with_anchor:
        i = next(i for i, x in enumerate(msgs) if x["content"] == anchors[0][0])
        assert msgs[i + 1] == {"role": "assistant", "content": anchors[0][1]}  # trained (no weight 0)
