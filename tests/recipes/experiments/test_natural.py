"""Phase 6's plain-speech data: held-out phrasings stay out, and every row says what it means."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from agent.probes.natural_text import CONCEPTS, HELDOUT_VALUES, says_not_told
from agent.runtime.checkpoint import load_model_dir
from recipes.demo_model.corpus import Passage
from recipes.demo_model.data import make_builder
from recipes.experiments.natural import NaturalBuilder, NaturalSpec, cache, phrasings
from recipes.experiments.natural_phrasings import ACKS, PHRASINGS, TRAIN_VALUES
from recipes.demo_model.vocab import TRAIN

DEFAULT = Path(__file__).resolve().parents[3] / "agent" / "models" / "demo"


def norm(s: str) -> str:
    return re.sub(r"[^a-z{}]+", " ", s.lower()).strip()


def test_every_concept_has_training_phrasings_and_none_is_held_out() -> None:
    assert set(PHRASINGS) == {c.name for c in CONCEPTS}
    for c in CONCEPTS:
        statements, questions, updates = phrasings(c)
        held = {norm(p) for p in (*c.statements, *c.questions, *c.updates)}
        assert not held & {norm(p) for p in (*statements, *questions, *updates)}, c.name
        assert all(p.count("{v}") == 1 for p in (*statements, *updates)), c.name
        assert not any("{v}" in q for q in questions), c.name
        assert len(statements) >= 4 and len(questions) >= 4, c.name


def test_training_values_never_are_the_probes() -> None:
    for kind, pool in HELDOUT_VALUES.items():
        assert not set(pool) & set(TRAIN_VALUES.get(kind, ())), kind


def test_one_pool_of_training_values_for_every_recipe() -> None:
    """The experiment's pool is the answer recipe's, not a copy that drifts: the copy this
    replaced still listed "dentist", a word the probe's own held-out concept asks about."""
    from recipes.answer.concepts import TRAIN_VALUES as ANSWER_VALUES

    assert TRAIN_VALUES is ANSWER_VALUES
    probe_words = {w for c in CONCEPTS for w in norm(c.name).split()}
    assert not {v.lower() for pool in TRAIN_VALUES.values() for v in pool} & probe_words


def test_the_cache_holds_paraphrases_and_everyday_replies_with_questions_kept_apart() -> None:
    data = cache()
    assert data["everyday"] and data["everyday_heldout"], "natural_cache.json is missing: run generate_natural"
    train_q = {norm(p["question"]) for p in data["everyday"]}
    assert not train_q & {norm(p["question"]) for p in data["everyday_heldout"]}
    for p in data["everyday"] + data["everyday_heldout"]:
        assert p["question"].endswith("?") and p["reply"][-1] in ".!?" and p["reply"].isascii()
    assert sum(len(v["statements"]) + len(v["questions"]) for v in data["paraphrases"].values()) > 0


@pytest.fixture(scope="module")
def rows() -> list[list[dict[str, str]]]:
    lm = load_model_dir(DEFAULT)
    passages = [Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them.")] * 3
    nb = NaturalBuilder(make_builder(TRAIN, passages, lm.tokenizer, lm.template))
    rng = random.Random(0)
    out = []
    for spec in (NaturalSpec(length=512, gap_min=0, gap_max=450), NaturalSpec(length=512, gap_min=0, gap_max=450, made_up=0.6, recall_block=0.5)):
        for _ in range(12):
            msgs = nb.dialogue(rng, spec)
            ids = sum((lm.template.message(lm.tokenizer, m["role"], m["content"], first=i == 0) for i, m in enumerate(msgs)), [])
            assert len(ids) == spec.length  # one packed row each
            out.append(msgs)
    return out


def _answers(msgs: list[dict[str, str]]):  # type: ignore[no-untyped-def]
    """(index, concept, value) for every recall answer in the row."""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        for c in CONCEPTS:
            head, _, tail = c.answer.partition("{v}")
            if m["content"].startswith(head) and m["content"].endswith(tail) and len(m["content"]) > len(head + tail):
                yield i, c, m["content"][len(head): len(m["content"]) - len(tail)]


def test_answers_give_the_latest_value_said_and_refusals_are_about_details_never_said(rows) -> None:  # type: ignore[no-untyped-def]
    answered = refused = 0
    for msgs in rows:
        for i, c, value in _answers(msgs):
            said = [m["content"] for m in msgs[:i] if m["role"] == "user"]
            assert any(value in s for s in said), (c.name, value)
            answered += 1
        answered_names = {c.name for _, c, _ in _answers(msgs)}
        for m in msgs:
            if m["role"] == "assistant" and says_not_told(m["content"]):
                (c,) = [c for c in CONCEPTS if c.not_told == m["content"]]
                assert c.name not in answered_names  # never stated in this row, so never answered
                refused += 1
    assert answered > 20 and refused > 20  # both kinds are common


def test_everyday_replies_fill_the_chat_between(rows) -> None:  # type: ignore[no-untyped-def]
    everyday = {p["reply"] for p in cache()["everyday"]}
    replies = [m["content"] for msgs in rows for m in msgs if m["role"] == "assistant"]
    assert sum(r in everyday for r in replies) > len(replies) // 4
    assert sum(r in ACKS for r in replies) > 0


def test_recall_blocks_repeat_the_latest_statement_as_chat_would_fold_it(rows) -> None:  # type: ignore[no-untyped-def]
    from agent.recall import rule as refresh

    blocks = 0
    for msgs in rows:
        answers = {i: (c, v) for i, c, v in _answers(msgs)}
        for i, m in enumerate(msgs):
            if m["role"] != refresh.BLOCK_ROLE or not m["content"].startswith(refresh.HEADER):
                continue
            blocks += 1
            assert msgs[i + 1]["role"] == "user" and msgs[i + 2]["role"] == "assistant"  # right before a question
            if i + 2 in answers:  # a stated detail: the block holds the value the answer gives
                assert answers[i + 2][1] in m["content"]
    assert blocks >= 5  # of the 12 rows drawn with recall_block=0.5 (seeded: a block also needs a faded detail asked about)


def test_made_up_values_are_words_and_never_the_probes() -> None:
    from recipes.experiments.natural import made_up_word, train_value

    rng = random.Random(0)
    held = {v.lower() for pool in HELDOUT_VALUES.values() for v in pool}
    words = [made_up_word(rng) for _ in range(2000)]
    assert not set(words) & held and len(set(words)) > 1000
    assert train_value(random.Random(1), "person", 1.0)[0].isupper() and train_value(random.Random(1), "num3", 1.0).isdigit()


def test_natural_check_counts_every_condition_split_by_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.experiments import natural_check

    natural_check.main([str(DEFAULT)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith(" ")]
    assert [ln.split(":")[0] for ln in lines] == list(natural_check.CONDITIONS)
    words = sum(c.kind[:3] not in ("num", "tim") for c in CONCEPTS)
    for ln in lines:
        m = re.search(r": (\d+)/26 \(words (\d+)/(\d+), numbers (\d+)/(\d+)\)$", ln)
        assert m, ln
        total, w, nw, n, nn = map(int, m.groups())
        assert (total, nw, nn) == (w + n, words, 26 - words)
