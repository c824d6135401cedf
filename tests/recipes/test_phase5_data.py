"""Phase 5's data and loss: key-local refusals, unrelated ghosts, updates in the drills,
fragment-word keys, composed phrasings, and the decision-token weights."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest
import torch

from agent.probes import text as probe_text
from recipes.demo_model import data as rdata
from recipes.demo_model.corpus import Passage
from recipes.demo_model.dialogues import Fact
from recipes.demo_model.keys import forced_check, write_block
from recipes.demo_model.plan import KEY_DRILL, LONG_DRILL, PLAN, KeyDrills
from recipes.demo_model.worlds import drill_world, fragment_words, phase3_world
from recipes.demo_model.vocab import COMPOSED, HELDOUT, TRAIN, composed
from recipes.demo_model.weighted import FocusTrainer
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.tokenizer import byte_level_tokenizer
from agent.train.data import encode_chat, pack

DEFAULT = Path(__file__).resolve().parents[2] / "agent" / "models" / "demo"
PASSAGES = [
    Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them."),
    Passage("beta", "Thing", "A thing that holds values. Values are kept in the order they were given."),
]
ANSWER = re.compile(r"The (.+?) for the (.+?) is (.+)\.$")
SLOT_ANSWER = re.compile(r"Your (.+?) is (.+)\.$")


def test_key_local_refusal_restates_the_key_before_refusing() -> None:
    code = Fact("code", "pin", "porch closet", "num5")
    slot = Fact("slot", "dog's name", "", "person")
    assert code.not_told() == "You haven't told me the pin for the porch closet."
    assert code.not_told(key_local=True) == "The pin for the porch closet is something you haven't told me."
    assert slot.not_told(key_local=True) == "Your dog's name is something you haven't told me."


def test_drills_answer_the_latest_value_and_refuse_never_stated_keys_at_the_key() -> None:
    lm = load_model_dir(DEFAULT)
    world = drill_world(PASSAGES, lm.tokenizer, random.Random(0))  # fragment-word keys: each thing is unique
    b = rdata.make_builder(world, PASSAGES, lm.tokenizer, lm.template)
    answers = refusals = updated = 0
    for seed in range(6):
        msgs = b.key_drill(random.Random(seed), dataclasses.replace(KEY_DRILL, length=512))
        said: list[str] = []  # user messages that give values
        for m in msgs[1:]:
            if m["role"] == "user":
                if re.search(r"\d{5}", m["content"]):
                    said.append(m["content"])
                continue
            hit = ANSWER.match(m["content"])
            if not hit:
                continue
            plain = [f" {u} ".replace("'s ", " ").replace(".", " ").replace(":", " ").replace(",", " ") for u in said]
            mentions = [u for u in plain if f" {hit.group(2)} " in u and f" {hit.group(1)} " in u]
            if hit.group(3) == "something you haven't told me":
                refusals += 1
                assert not mentions, m["content"]  # never stated
            elif re.fullmatch(r"\d{5}", hit.group(3)):  # (the other value kinds are not tracked here)
                answers += 1
                assert mentions and hit.group(3) in mentions[-1]  # the latest value given for that key
                updated += len(mentions) > 1
    assert answers > 20 and refusals > 10 and updated > 0


def test_slot_drills_answer_the_users_own_details_by_key_and_refuse_the_unsaid_ones() -> None:
    lm = load_model_dir(DEFAULT)
    b = rdata.make_builder(drill_world(PASSAGES, lm.tokenizer, random.Random(0)), PASSAGES, lm.tokenizer, lm.template)
    answers = refusals = updated = codes = 0
    for seed in range(4):
        msgs = b.key_drill(random.Random(seed), LONG_DRILL)
        said: list[str] = []  # statements: user messages acknowledged rather than answered
        for q, m in zip(msgs[1:], msgs[2:]):
            if q["role"] != "user":
                continue
            codes += bool(ANSWER.match(m["content"]))
            hit = SLOT_ANSWER.match(m["content"])
            if not hit:
                said += [] if ANSWER.match(m["content"]) else [q["content"]]
                continue
            slot, value = hit.groups()
            told = [u for u in said if re.search(rf"\bmy (old |new )?{re.escape(slot)}\b", u, re.IGNORECASE)]
            if value == "something you haven't told me":
                refusals += 1
                assert not told, m["content"]  # that detail was never given in the row before
            else:
                answers += 1
                assert told and value in told[-1], m["content"]  # the latest value given for it
                updated += len(told) > 1
    assert answers > 15 and refusals > 5 and updated > 0 and codes > 15  # codes are still drilled beside them


def test_fragment_words_are_new_words_made_of_the_tokenizers_pieces() -> None:
    tok = load_model_dir(DEFAULT).tokenizer
    words = fragment_words(tok, random.Random(5), 500)
    assert words == fragment_words(tok, random.Random(5), 500)  # seeded
    banned = {*HELDOUT.thing_adj, *HELDOUT.thing_noun, *probe_text.ADJECTIVES, *probe_text.NOUNS}
    assert not banned & set(words)
    assert all(re.fullmatch(r"[a-z]{2,14}", w) for w in words)
    assert len(set(words)) > 450 and sum(len(tok.encode(" " + w)) > 1 for w in words) > 300
    letters = fragment_words(byte_level_tokenizer(), random.Random(0), 200)  # no word pieces: random letters
    assert all(re.fullmatch(r"[a-z]{2,9}", w) for w in letters) and len(set(letters)) > 190


def test_composed_phrasings_add_to_the_world_and_none_is_held_out() -> None:
    world = composed(TRAIN)
    for name, extra in COMPOSED.items():
        assert getattr(world, name) == getattr(TRAIN, name) + extra
        assert not set(extra) & set(getattr(HELDOUT, name)), name
        fields = {"code": ("{attr}", "{thing}"), "slot": ("{slot}",)}[name.split("_")[-1] if name.startswith("update") else name.split("_")[0]]
        assert all(f in t for t in extra for f in fields)
        if "statements" in name or name.startswith("update"):
            assert all("{value}" in t for t in extra)
    assert any(" to {value}" in t for t in COMPOSED["code_statements"])  # the shape a held-out statement has


BLOCKS = {s.name.split(".")[1]: s.data for s in PLAN if s.phase == 5}


@pytest.mark.parametrize(("name", "shares"), [("bind", (0.0, 1.0)), ("decide", (0.0, 1.0)), ("mix", (0.4, 0.4)), ("long", (0.4, 0.4))])
def test_blocks_hold_rows_drills_and_prose_in_their_shares(name: str, shares: tuple[float, float], tmp_path: Path) -> None:
    lm = load_model_dir(DEFAULT)
    block = BLOCKS[name]
    assert isinstance(block, KeyDrills)
    info = write_block(tmp_path, block, seed=1, steps=4, lm=lm, train=PASSAGES)
    total, rows = 4 * 4096, block.drill.length
    assert info["key_drill_tokens"] % rows == 0 and 0.9 * shares[1] < info["key_drill_tokens"] / total < 1.3 * shares[1]
    assert ("phase3_tokens" in info) == bool(shares[0]) and (tmp_path / "b_text.jsonl").exists() == bool(shares[0])
    drills = [json.loads(x)["messages"] for x in (tmp_path / "a_keys.jsonl").read_text().splitlines()]
    refusals = [m["content"] for d in drills for m in d if m["role"] == "assistant" and "haven't told" in m["content"]]
    if name == "bind":  # the measured first-digit-only run's drills: real words, the leading refusal
        assert refusals and all(r.startswith("You haven't told me the ") for r in refusals)
    else:
        assert refusals and all(r.endswith(" is something you haven't told me.") for r in refusals)
    slots = [m for d in drills for m in d if m["role"] == "assistant" and m["content"].startswith("Your ")]
    assert bool(slots) == (name == "long")  # only the last block drills the user's own details


def test_decide_block_key_words_real_or_made_up(tmp_path: Path) -> None:
    lm = load_model_dir(DEFAULT)

    def things(keys: str) -> set[str]:
        write_block(tmp_path / keys, dataclasses.replace(BLOCKS["decide"], keys=keys), seed=1, steps=2, lm=lm, train=PASSAGES)
        rows = [json.loads(x)["messages"] for x in (tmp_path / keys / "a_keys.jsonl").read_text().splitlines()]
        return {hit.group(2) for d in rows for m in d if m["role"] == "assistant" and (hit := ANSWER.match(m["content"]))}

    real, made_up = things("real"), things("fragment")
    world = phase3_world(PASSAGES)
    words = set(world.thing_adj) | set(world.thing_noun)
    assert real and all(set(t.split()) <= words for t in real)
    assert sum(not set(t.split()) <= words for t in made_up) > len(made_up) / 2
    with pytest.raises(ValueError, match="unknown key words 'greek'"):
        write_block(tmp_path / "x", dataclasses.replace(BLOCKS["decide"], keys="greek"), seed=1, steps=2, lm=lm, train=PASSAGES)


def test_forced_check_reads_binding_and_the_refusal_choice() -> None:
    out = forced_check(load_model_dir(DEFAULT), trials=6)
    assert set(out) == {"bind_right", "bind_other", "bind_right_wins", "refusal_auc"}
    assert 0 < out["bind_right"] + out["bind_other"] <= 1 and 0 <= out["refusal_auc"] <= 1
    assert out == forced_check(load_model_dir(DEFAULT), trials=6)  # its own seed: the same every time


@pytest.mark.parametrize("only", [False, True])
def test_focus_weights_the_copied_key_the_decision_and_the_first_digit(only: bool) -> None:
    lm = load_model_dir(DEFAULT)
    msgs = [{"role": "system", "content": ""},
            {"role": "user", "content": "What is the pin for the zqx box?"},
            {"role": "assistant", "content": "The pin for the zqx box is 72345."},
            {"role": "user", "content": "And the pin for the abu cdo?"},
            {"role": "assistant", "content": "The pin for the abu cdo is something you haven't told me."},
            {"role": "user", "content": "Tell me about the for the loop."}, {"role": "assistant", "content": "It loops for the list."}]
    doc = encode_chat(msgs, lm.tokenizer, lm.template)
    _, labels = pack([doc], len(doc.ids) - 1, 0).rows(torch.tensor([0]))

    def picked(focus: tuple[str, ...]) -> tuple[list[str], torch.Tensor]:
        t = FocusTrainer.__new__(FocusTrainer)
        t.base, t.answer_weight, t.focus_on, t.focus_weight, t.focus_only = lm, 4.0, focus, 8.0, only
        w = t._weights(labels)
        return [lm.tokenizer.decode([i]) for i, x in zip(labels[0].tolist(), w[0].tolist()) if x == 8.0], w

    every, w = picked(FocusTrainer.FOCUS)
    text = "".join(every)
    assert "zqx box" in text and "abu cdo" in text and " something" in every and "7" in every
    assert " is" not in every and "2345" not in text and "list" not in text  # the key ends at " is"; not a recall answer
    if only:
        assert set(w[0].tolist()) <= {0.0, 8.0}
    else:
        assert {1.0, 4.0, 8.0} <= set(w[0].tolist())
    assert picked(("digit",))[0] == ["7"]
    assert picked(("decision",))[0] == [" ", " something"]  # a value's space, the refusal's first word
    assert "".join(picked(("key",))[0]) == " zqx box abu cdo"


def test_focus_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown focus \\['first'\\]"):
        FocusTrainer(None, focus=("digit", "first"))  # type: ignore[arg-type]
