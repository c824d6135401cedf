"""The default model's data builder: seeded, exact row lengths, held out for real."""

from __future__ import annotations

import json
import random
import re

import pytest

from agent.probes import text as probe_text
from agent.recipes import data as rdata
from agent.recipes.corpus import Passage, is_heldout, read_passages, split_passages
from agent.recipes.dialogues import DialogueSpec
from agent.recipes.phase2 import phase2_world, score
from agent.recipes.vocab import HELDOUT, TRAIN
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


def test_questions_are_answered_with_the_latest_value_or_not_told() -> None:
    tok, template = byte_level_tokenizer(), ChatTemplate()
    b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
    rng = random.Random(3)
    answers = 0
    for _ in range(20):
        msgs = b.dialogue(rng, DialogueSpec(length=512, gap_min=0, gap_max=200))
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
