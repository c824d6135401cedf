"""Phase 4's data: key drill rows, the plain-text lookup task, and the blocks' mix."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from recipes.default_model import data as rdata
from recipes.default_model import lookup
from recipes.default_model.corpus import Passage
from recipes.default_model.dialogues import DialogueSpec
from recipes.default_model.phase4 import write_block
from recipes.default_model.vocab import TRAIN
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.tokenizer import byte_level_tokenizer

DEFAULT = Path(__file__).resolve().parents[2] / "agent" / "models" / "default"
PASSAGES = [
    Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them."),
    Passage("beta", "Thing", "A thing that holds values. Values are kept in the order they were given."),
]
STATED = re.compile(r"[Tt]he ([a-z]+(?: [a-z]+)?) for the ([a-z]+ [a-z]+) is ([0-9a-z x]+?)\.")


@pytest.mark.parametrize("length", [256, 512])
def test_key_drill_rows_answer_from_the_row_and_ghosts_are_never_stated(length: int, tmp_path: Path) -> None:
    lm = load_model_dir(DEFAULT)
    tok, template = lm.tokenizer, lm.template
    b = rdata.make_builder(TRAIN, PASSAGES, tok, template)
    spec = DialogueSpec(length=length, gap_min=0, gap_max=0, key_drill=True)
    # write_dialogues checks every row is exactly `length` tokens.
    assert rdata.write_dialogues(tmp_path / "d.jsonl", b, random.Random(1), spec, 20, tok, template) == 20 * length
    answers = ghosts = near = codes = 0
    for line in (tmp_path / "d.jsonl").read_text().splitlines():
        said: dict[tuple[str, str], str] = {}
        keys: list[tuple[str, str]] = []
        for m in json.loads(line)["messages"]:
            if m["role"] == "user":
                for attr, thing, value in STATED.findall(m["content"]):
                    key = (attr, thing)
                    codes += 1
                    near += any(sum(a != b_ for a, b_ in zip((attr, *thing.split()), (o[0], *o[1].split()))) == 1 for o in keys)
                    said[key] = value
                    keys.append(key)
            elif m["role"] == "assistant":
                hit = re.match(r"The ([a-z]+(?: [a-z]+)?) for the ([a-z]+ [a-z]+) is (.+)\.$", m["content"])
                if hit:
                    assert said[(hit.group(1), hit.group(2))] == hit.group(3)
                    answers += 1
                miss = re.match(r"You haven't told me the ([a-z]+(?: [a-z]+)?) for the ([a-z]+ [a-z]+)\.$", m["content"])
                if miss:
                    assert (miss.group(1), miss.group(2)) not in said
                    ghosts += 1
    assert answers >= 2 * 20 * length // 256 and ghosts >= 5
    assert 0.15 < near / codes < 0.6  # siblings: one word off an earlier code


def test_lookup_records_ask_the_same_pairs_again_in_another_order() -> None:
    words = [f"w{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    r = lookup.record(random.Random(3), words)
    assert r == lookup.record(random.Random(3), words)
    head, tail = r.removeprefix("Keys and codes: ").removesuffix(".").split(". Asked again: ")
    first, again = head.split(", "), tail.split(", ")
    assert len(first) == lookup.PAIRS == len({p.split()[0] for p in first})
    assert sorted(first) == sorted(again) and first != again
    assert all(re.fullmatch(r"w[a-z] [1-9][0-9]{4}", p) for p in first)


def test_key_words_are_one_token_each_or_the_worlds_nouns() -> None:
    lm = load_model_dir(DEFAULT)
    words = lookup.key_words(lm.tokenizer)
    assert len(words) >= 4 * lookup.PAIRS
    assert all(len(lm.tokenizer.encode(" " + w)) == 1 for w in words)
    assert lookup.key_words(byte_level_tokenizer()) == list(TRAIN.thing_noun)


@pytest.mark.parametrize(("name", "row"), [("lookup", 256), ("mix", 512)])
def test_blocks_hold_drills_lookup_records_and_prose_in_their_shares(name: str, row: int, tmp_path: Path) -> None:
    lm = load_model_dir(DEFAULT)
    info = write_block(tmp_path, name, seed=1, steps=4, lm=lm, train=PASSAGES)
    total = 4 * 4096
    assert info["key_drill_tokens"] > 0 and info["key_drill_tokens"] % row == 0
    text = [json.loads(x)["text"] for x in (tmp_path / "b_text.jsonl").read_text().splitlines()]
    records = [t for t in text if t.startswith("Keys and codes: ")]
    assert len(records) == info["lookup_records"] > 0 and len(text) > len(records)  # prose too
    lookup_tokens = sum(len(lm.tokenizer.encode(t)) for t in records)
    share = {"lookup": 0.5, "mix": 0.25}[name]
    assert 0.8 * share < lookup_tokens / total < 1.4 * share
    if name == "mix":
        assert info["phase3_tokens"] % 512 == 0 and info["phase3_tokens"] > info["key_drill_tokens"]
