"""The demo model's data builder: seeded, exact row lengths, held out for real."""

from __future__ import annotations

import json
import random
import re

import pytest

from agent.probes import text as probe_text
from recipes.demo_model import data as rdata
from recipes.demo_model.corpus import Passage, is_heldout, read_passages, split_passages, wide_text
from recipes.demo_model.dialogues import DialogueSpec
from recipes.demo_model.build import validation_score as score
from recipes.demo_model.worlds import phase2_world
from recipes.demo_model.vocab import HELDOUT, TRAIN, VARIED, varied
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from agent.train.data import load_documents, pack

PASSAGES = [
    Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them."),
    Passage("beta", "Thing", "A thing that holds values. Values are kept in the order they were given."),
]


def _words(world) -> set[str]:  # type: ignore[no-untyped-def]
    return set(world.thing_adj) | set(world.thing_noun) | set(world.people)


def test_worlds_share_no_keys_names_or_phrasings() -> None:
    assert not _words(TRAIN) & _words(HELDOUT)
    assert not {s for s, _ in TRAIN.slots} & {s for s, _ in HELDOUT.slots}
    for field in ("code_statements", "slot_statements", "code_questions", "slot_questions", "update_code", "update_slot", "acks"):
        assert not set(getattr(TRAIN, field)) & set(getattr(HELDOUT, field)), field


def test_training_keys_avoid_the_probe_suites_key_words() -> None:
    probe = set(probe_text.ADJECTIVES) | set(probe_text.NOUNS)
    assert not (set(TRAIN.thing_adj) | set(TRAIN.thing_noun)) & probe


@pytest.mark.parametrize("length", [256, 512, 1024])
def test_dialogues_are_exact_rows_and_seeded(length: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tok, template = byte_level_tokenizer(), ChatTemplate()
    spec = DialogueSpec(length=length, gap_min=0, gap_max=length // 2)
    paths = []
    for i in range(2):
        b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
        p = tmp_path / f"d{i}.jsonl"
        n = rdata.write_dialogues(p, b, random.Random(7), spec, 6, tok, template)
        assert n == 6 * length
        paths.append(p)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    docs, _ = load_documents([paths[0]], tok, template)
    assert all(len(d.ids) == length for d in docs)
    packed = pack(docs, length, 0)
    # Each row is one whole dialogue: it starts with BOS, so no question crosses rows.
    assert bool((packed.tokens[:, 0] == tok.token_id("<|bos|>")).all())


@pytest.mark.parametrize("ghost_prob", [0.0, 1.0])
def test_questions_are_answered_with_the_latest_value_or_not_told(ghost_prob: float) -> None:
    tok, template = byte_level_tokenizer(), ChatTemplate()
    b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
    rng = random.Random(3)
    answers = 0
    for _ in range(20):
        msgs = b.dialogue(rng, DialogueSpec(length=512, gap_min=0, gap_max=200, ghost_prob=ghost_prob, near_miss=0.5))
        said: dict[str, str] = {}
        for m in msgs:
            if m["role"] in ("user", "document"):
                for key, value in re.findall(r"[Tt]he ([a-z ]+? for the [a-z ]+?) (?:is now|is|changed to) ([0-9a-zA-Z ]+?)\.", m["content"]):
                    said[key] = value
            elif m["role"] == "assistant":
                hit = re.match(r"The ([a-z ]+? for the [a-z ]+?) is (.+)\.$", m["content"])
                if hit:
                    assert said.get(hit.group(1)) == hit.group(2), (hit.group(1), said)
                    answers += 1
                miss = re.match(r"You haven't told me the ([a-z ]+? for the [a-z ]+?)\.$", m["content"])
                if miss:
                    assert miss.group(1) not in said
    assert answers > 10


def _not_told_positions(spec: DialogueSpec, n: int = 30) -> tuple[list[int], dict[str, int]]:
    """Token positions of every "You haven't told me" reply, and the builder's counts."""
    tok, template = byte_level_tokenizer(), ChatTemplate()
    b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
    rng = random.Random(5)
    at = []
    for _ in range(n):
        pos = 0
        for i, m in enumerate(b.dialogue(rng, spec)):
            if m["role"] == "assistant" and m["content"].startswith("You haven't told me"):
                at.append(pos)
            pos += len(template.message(tok, m["role"], m["content"], first=i == 0))
    return at, b.stats


def test_ghost_questions_come_after_the_same_gap_as_stated_ones() -> None:
    # Every fact is asked exactly 300 tokens after it was stated; a ghost (a key never
    # stated) is scheduled with the fact, so it too is asked no sooner than that.
    spec = DialogueSpec(length=1024, gap_min=300, gap_max=300, never_prob=0.0, ghost_prob=1.0, near_miss=0.5)
    at, stats = _not_told_positions(spec)
    assert len(at) == stats["never"] and min(at) >= 300
    assert 0.6 * stats["questions"] <= stats["never"] <= 1.5 * stats["questions"]
    # Free-slot never-stated questions (the old way) come anywhere, mostly before any gap ends.
    old, _ = _not_told_positions(DialogueSpec(length=1024, gap_min=300, gap_max=300, never_prob=0.3))
    assert sum(p < 300 for p in old) > len(old) // 4
    assert _not_told_positions(DialogueSpec(length=1024, gap_min=300, gap_max=300, never_prob=0.0))[1].get("never", 0) == 0


def test_near_gap_asks_some_facts_and_ghosts_at_once() -> None:
    spec = DialogueSpec(length=1024, gap_min=300, gap_max=300, never_prob=0.0, ghost_prob=1.0, near_gap=1.0)
    at, stats = _not_told_positions(spec)
    # Ghosts of the first facts are asked within NEAR_GAP tokens of their statement, long
    # before any 300-token gap ends (without near_gap none is: see the test above).
    assert stats["never"] >= 20 and sum(p < 300 for p in at) >= 5


def test_wide_text_adds_the_language_reference_and_torch_docstrings_but_holds_nothing_out() -> None:
    train, held = split_passages(read_passages())
    wide = wide_text(train)
    modules = {p.module for p in wide}
    assert "pydoc_data.topics" in modules and any(m.startswith("torch.") for m in modules)
    assert sum(len(p.text) for p in wide) > 3 * sum(len(p.text) for p in train)
    assert not modules & {p.module for p in held}
    texts = {p.text for p in wide}
    assert not any(p.text in texts for p in held)


def test_write_stage_draws_its_plain_text_from_the_given_pool(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tok, template = byte_level_tokenizer(), ChatTemplate()
    pool = [Passage("gamma", "module", f"Gamma passage number {i} is plain text for the model to read.") for i in range(50)]
    rdata.write_stage(tmp_path, seed=1, stage=0, spec=DialogueSpec(length=256, gap_min=0, gap_max=100), n_dialogues=4,
                      passages=PASSAGES, tok=tok, template=template, text_share=0.5, text=pool)
    rows = [json.loads(line)["text"] for line in (tmp_path / "b_text.jsonl").read_text().splitlines()]
    assert rows and all(r.startswith("Gamma passage") for r in rows)


def test_stdlib_corpus_split_is_by_module() -> None:
    passages = read_passages()
    train, held = split_passages(passages)
    assert len(train) > 1000 and len(held) > 50
    assert not {p.module for p in train} & {p.module for p in held}
    assert all(is_heldout(p.module) for p in held)


def test_tokenizer_is_seeded_and_has_chat_tokens() -> None:
    a = rdata.train_tokenizer(PASSAGES * 20, seed=1, vocab_size=400)
    b = rdata.train_tokenizer(PASSAGES * 20, seed=1, vocab_size=400)
    assert a.digest() == b.digest()
    assert a.token_id("<|bos|>") == 0 and a.token_id("<|document|>") == 5
    assert len(a.encode(" 48213")) == 6  # a space, then one token per digit
    assert a.decode(a.encode("The code for the red door is 48213.")) == "The code for the red door is 48213."
    json.loads(a.to_json())


def test_phase2_world_widens_keys_but_keeps_held_out_and_probe_words_out() -> None:
    train, _ = split_passages(read_passages())
    world = phase2_world(train)
    things = set(world.thing_adj) | set(world.thing_noun)
    assert len(things) > 10 * len(set(TRAIN.thing_adj) | set(TRAIN.thing_noun))
    assert not things & (set(HELDOUT.thing_adj) | set(HELDOUT.thing_noun))
    assert not things & (set(probe_text.ADJECTIVES) | set(probe_text.NOUNS))
    assert world.code_statements == TRAIN.code_statements and world.people == TRAIN.people
    slots = {name for name, _ in world.slots}
    assert len(slots) > 5 * len(TRAIN.slots) and not slots & {name for name, _ in HELDOUT.slots}
    assert {kind for _, kind in world.slots} <= {kind for _, kind in TRAIN.slots}


@pytest.mark.parametrize("update_prob", [0.0, 0.3])
def test_update_rate_follows_the_spec(update_prob: float) -> None:
    tok, template = byte_level_tokenizer(), ChatTemplate()
    b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
    rng = random.Random(3)
    for _ in range(30):
        b.dialogue(rng, DialogueSpec(length=1024, gap_min=200, gap_max=400, update_prob=update_prob))
    updates = b.stats.get("updates", 0)
    assert (updates == 0) if update_prob == 0 else (updates >= 20)  # 8 at the old fixed rate of 0.08


def test_phase2_score_rewards_recall_and_not_told_and_penalizes_stale() -> None:
    perfect = {"recall_5digit": {256: 1.0, 512: 1.0}, "not_told": {256: 1.0}, "update_stale": {256: 0.0}}
    stale = {**perfect, "update_stale": {256: 1.0}}
    forgetful = {**perfect, "recall_5digit": {256: 1.0, 512: 0.0}}
    assert score(perfect) == 1.0
    assert score(stale) == score(forgetful) == 0.75


def test_vary_live_caps_some_dialogues_at_one_or_two_facts() -> None:
    # Questions only come after 700 tokens, so the facts stated before then are the cap.
    tok, template = byte_level_tokenizer(), ChatTemplate()
    per: dict[bool, list[int]] = {}
    for vary in (False, True):
        b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
        rng = random.Random(3)
        per[vary] = []
        for _ in range(30):
            before = b.stats.get("facts", 0)
            b.dialogue(rng, DialogueSpec(length=1024, gap_min=700, gap_max=700, max_live=8, plant_prob=0.6, vary_live=vary))
            per[vary].append(b.stats["facts"] - before)
    assert sum(n <= 2 for n in per[True]) >= 3 > sum(n <= 2 for n in per[False])
    assert max(per[True]) >= 5


def test_varied_phrasings_add_to_the_world_and_none_is_held_out() -> None:
    world = varied(TRAIN)
    fields = {"code_statements": ("{attr}", "{thing}", "{value}"), "slot_statements": ("{slot}", "{value}"),
              "code_questions": ("{attr}", "{thing}"), "slot_questions": ("{slot}",), "update_code": ("{attr}", "{thing}", "{value}"),
              "update_slot": ("{slot}", "{value}"), "acks": (), "update_acks": ()}
    assert set(fields) == set(VARIED)
    for name, holes in fields.items():
        mine = getattr(world, name)
        assert mine[: len(getattr(TRAIN, name))] == getattr(TRAIN, name) and len(mine) > len(getattr(TRAIN, name))
        assert not set(mine) & set(getattr(HELDOUT, name)), name
        for t in VARIED[name]:
            assert all(h in t for h in holes), t
            if "{value}" not in holes:
                assert "{value}" not in t, t
    # The held-out lead-ins stay held out, not just the exact templates.
    said = " ".join(t for v in VARIED.values() for t in v)
    for lead in ("For the record", "Keep in mind", "I set", "I should mention", "did I give you", "Can you recall", "Correction"):
        assert lead not in said, lead
