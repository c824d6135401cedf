"""The recall-refresh selection rule (agent/recall/rule.py): pure, so tested without a model."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from agent.recall import rule as refresh
from agent.recall.rule import Candidate, build_block, render, select, terms


def words(text: str) -> int:
    """A stand-in token count: one token per whitespace-separated word."""
    return len(text.split())


def pick(message: str, cands: list[Candidate], horizon: int = 100, budget: int = 200) -> list[int]:
    return [r.turn_id for r in select(message, cands, horizon=horizon, budget=budget, count=words)]


def test_terms_drop_stop_words_and_fold_word_forms() -> None:
    assert terms("What is my locker code?") == ["locker", "cod"]
    assert refresh.query_words("What is my locker code? " + " ".join(f"w{i}" for i in range(100)))[:3] == [
        "locker", "code", "w0"]
    assert len(refresh.query_words(" ".join(f"w{i}" for i in range(100)))) == refresh.MAX_QUERY_WORDS
    assert terms("The codes for my lockers") == ["cod", "locker"]
    assert terms("what is it?") == []
    # Plain speech: the same word in other forms, and discourse words that carry nothing.
    assert terms("I parked the car") == terms("Where did I park the cars?") == ["park", "car"]
    assert terms("I grew up in Cork") == ["grow", "cork"] and terms("Where did I grow up?") == ["grow"]
    assert terms("moved, moving, moves") == ["mov"] and terms("I worked") == terms("my work") == ["work"]
    assert terms("Sorry, quick question: hmm, okay, my sister?") == ["sister"]
    assert "grew" in refresh.query_words("Where did I grow up?")  # the index is asked for every form


def test_one_rare_shared_word_will_do_when_none_shares_two() -> None:
    cands = [Candidate(1, "user", "Ugh, I have to see the dentist on May 3.", distance=900),
             Candidate(2, "user", "What a day it was, a long day.", distance=800),
             Candidate(3, "assistant", "Have a good day.", distance=700)]
    assert pick("What day is my dentist appointment?", cands) == [1]  # "day" is common here, "dentist" rare
    cands.append(Candidate(4, "user", "The dentist appointment is on June 9.", distance=600))
    assert pick("What day is my dentist appointment?", cands) == [4]  # two shared words: the strict pass


def test_only_faded_relevant_turns_are_recalled_oldest_first() -> None:
    cands = [
        Candidate(1, "user", "My locker code is 48213.", distance=900),
        Candidate(2, "assistant", "Noted.", distance=890),
        Candidate(3, "user", "The weather is nice and the garden is green.", distance=500),
        Candidate(4, "user", "I changed the locker code: it is 55555 now.", distance=300),
        Candidate(5, "user", "Do you still know my locker code?", distance=50),  # within the horizon
    ]
    assert pick("What is my locker code?", cands) == [4]  # 4 restates (supersedes) 1
    assert pick("What is my locker code?", cands, horizon=1000) == []
    assert pick("How is the weather?", cands) == [3]
    assert pick("What is it?", cands) == []  # no content words: nothing to look for


def test_three_word_questions_need_two_shared_words() -> None:
    cands = [Candidate(1, "user", "The amber locker is by the door.", distance=500),
             Candidate(2, "user", "The code for the amber locker is 12345.", distance=600),
             Candidate(3, "user", "That code was long.", distance=700)]
    assert pick("What is the code for the amber locker?", cands) == [2, 1]
    assert pick("What is the code for the amber locker?", cands, budget=15) == [2]


def test_only_the_sentences_that_matter_are_repeated() -> None:
    cands = [Candidate(1, "user", "The code for the red gate is 111. The code for the blue van is 222. Bye.", 800)]
    (r,) = select("What is the code for the blue van?", cands, horizon=100, budget=200, count=words)
    assert r.line == "The code for the blue van is 222."
    assert render([r]) == refresh.HEADER + "\n\nUser: The code for the blue van is 222."


def test_the_block_never_exceeds_the_budget() -> None:
    cands = [Candidate(i, "user", f"box{i} locker code is {10000 + i}.", 200 + 10 * i) for i in range(40)]
    q = "locker codes of " + " ".join(f"box{i}" for i in range(40))
    for budget in (8, 12, 30, 80):
        chosen = select(q, cands, horizon=100, budget=budget, count=words)
        assert words(render(chosen)) <= budget
    assert select(q, cands, horizon=100, budget=5, count=words) == []  # not even the header fits
    assert len(select(q, cands, horizon=100, budget=80, count=words)) > 3


def test_ties_prefer_the_newer_turn() -> None:
    cands = [Candidate(1, "user", "The locker code is 1.", 900), Candidate(2, "user", "The locker code is 2.", 400)]
    assert pick("locker code", cands, budget=12) == [2]


def test_the_rule_imports_neither_torch_nor_the_store() -> None:
    code = "import sys, agent.recall.rule; print('\\n'.join(sys.modules))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not {m for m in mods if m.split(".")[0] in {"torch", "sqlite3", "sqlite_utils", "sessions", "textual"}}


def test_a_faded_statement_superseded_by_a_recent_one_stays_out() -> None:
    old = Candidate(1, "user", "The code for the jade trunk is 111.", 900)
    update = Candidate(2, "user", "Update: the code for the jade trunk is now 222.", 50)
    asked = Candidate(3, "user", "What is the code for the jade trunk?", 40)
    reply = Candidate(4, "assistant", "The code for the jade trunk is 111.", 30)
    q = "What is the code for the jade trunk?"
    assert pick(q, [old, update]) == []  # the state holds the update
    assert pick(q, [old, replace(update, distance=500)]) == [2]  # both faded: only the update
    assert pick(q, [old, asked, reply]) == [1]  # a question or another role does not supersede


def test_earlier_questions_are_not_recalled() -> None:
    cands = [Candidate(1, "user", "My locker code is 48213. Will you remember it?", 900),
             Candidate(2, "user", "What is my locker code?", 600),
             Candidate(3, "user", "Do you know my locker code? And the gym one?", 500)]
    chosen = select("What is my locker code?", cands, horizon=100, budget=200, count=words)
    assert [(r.turn_id, r.line) for r in chosen] == [(1, "My locker code is 48213.")]


def test_one_word_in_later_chat_does_not_supersede_a_statement() -> None:
    cands = [Candidate(1, "user", "Big news: we're moving to Krakow in the spring.", distance=2000),
             Candidate(2, "user", "The silver badge moves every vault.", distance=300)]  # within the horizon
    assert pick("Where am I moving to?", cands, horizon=512) == [1]
    # Two shared words or more do: the hotel room, then the room it was changed to.
    cands = [Candidate(1, "user", "My hotel room is 512.", distance=2000),
             Candidate(2, "user", "Actually, the hotel moved me to room 604.", distance=300)]
    assert pick("Which room am I in at the hotel?", cands, horizon=512) == []


def test_an_earlier_not_told_reply_is_never_recalled() -> None:
    cands = [Candidate(1, "user", "My sister Vera is visiting me next week.", distance=2000),
             Candidate(2, "assistant", "You haven't told me your sister's name.", distance=1500)]
    assert pick("What's my sister's name?", cands, horizon=512) == [1]


def test_build_block_folds_what_it_counts() -> None:
    """The block's ids are `encode` of its text, and the budget counts those very ids."""
    cands = [Candidate(1, "user", "My locker code is 48213.", 900)]

    def encode(text: str) -> list[int]:
        return [0, *range(len(text.split())), 0]  # two template tokens around the words

    block = build_block("What is my locker code?", cands, horizon=100, budget=200, encode=encode)
    assert block is not None and block.text == render(block.chosen) and block.token_ids == encode(block.text)
    assert build_block("What is my locker code?", cands, horizon=100, budget=len(encode(block.text)) - 1, encode=encode) is None
    assert build_block("What is my locker code?", cands, horizon=1000, budget=200, encode=encode) is None
