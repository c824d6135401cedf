"""Recall refresh in ChatService on a real store and the tiny model: what is recalled, the
token bound, that `refresh off` adds nothing, and that the state still equals a replay."""

from __future__ import annotations

from agent.chat.types import TurnStarted
from agent.recall.rule import HEADER

from .test_chat_service import assert_state_matches_transcript, run

FACT = "My locker code is 48213."
CHATTER = "Tell me about the garden, the river and the old mill by the bridge today, please."


def converse(svc, question: str = "What is my locker code?"):
    """A fact, enough chatter to push it past a 200-token horizon, then the question.
    Returns (the fact's turn id, the question's events)."""
    svc.new_session(system="be brief")
    run(svc.send(FACT))
    fact_id = next(t.id for t in svc.tail() if t.content == FACT)
    for _ in range(3):
        run(svc.send(CHATTER))
    return fact_id, run(svc.send(question))


def test_a_faded_fact_is_recalled_as_its_own_turn_and_state_equals_replay(make_service):
    svc = make_service(refresh_horizon=200)
    fact_id, events = converse(svc)
    started = next(e for e in events if isinstance(e, TurnStarted))
    block = started.recall_turn
    assert block is not None and block.kind == "recall" and block.role == "document"
    assert block.content == f"{HEADER}\n\nUser: {FACT}"
    stored = svc.store.tree.get_turn(block.id)
    assert stored.stats["kind"] == "recall" and stored.stats["turns"] == [fact_id] and stored.stats["horizon"] == 200
    assert svc.store.tree.turn_token_ids(block.id) == svc.lm.template.message(svc.lm.tokenizer, "document", block.content)
    *_, recall, user, reply = svc.tail()
    assert (recall.id, user.role, user.content) == (block.id, "user", "What is my locker code?")
    assert user.parent_id == recall.id and reply.used_recall and not user.used_recall
    assert_state_matches_transcript(svc)  # the block was folded exactly as stored


def test_refresh_off_adds_nothing_and_is_stored_with_the_session(make_service):
    svc = make_service(refresh_horizon=200, refresh=False)
    _, events = converse(svc)
    assert next(e for e in events if isinstance(e, TurnStarted)).recall_turn is None
    assert [t.role for t in svc.tail()].count("document") == 0
    on = make_service(refresh_horizon=200)
    on.new_session()
    on.set_option("refresh", "off")
    assert on.store.core.get_session(on.session.uid).options["refresh"] is False
    uid = on.session.uid
    on.close()
    again = make_service(refresh_horizon=200)
    again.resume(uid)
    assert again.options.refresh.on is False


def test_turns_within_the_horizon_and_unrelated_turns_are_not_recalled(make_service):
    svc = make_service(refresh_horizon=100_000)
    _, events = converse(svc)
    assert next(e for e in events if isinstance(e, TurnStarted)).recall_turn is None
    svc2 = make_service(refresh_horizon=200)
    _, events = converse(svc2, question="Which colour do zebras have?")
    assert next(e for e in events if isinstance(e, TurnStarted)).recall_turn is None


def test_the_block_stays_within_its_token_budget(make_service):
    svc = make_service(refresh_horizon=50, refresh_tokens=120)
    svc.new_session()
    for i in range(6):
        run(svc.send(f"Note {i}: the locker code for box {i} is {10000 + i}, keep it safe."))
    run(svc.send(CHATTER))  # every note is now past the horizon
    events = run(svc.send("Which locker codes did I give you for box 0, box 1, box 2, box 3, box 4 and box 5?"))
    block = next(e for e in events if isinstance(e, TurnStarted)).recall_turn
    assert block is not None
    ids = svc.store.tree.turn_token_ids(block.id)
    assert 0 < len(ids) <= 120
    assert 1 <= len(svc.store.tree.get_turn(block.id).stats["turns"]) < 6  # the budget cut some notes
    assert_state_matches_transcript(svc)


def test_regenerate_after_a_recall_keeps_the_block_and_the_mark(make_service):
    svc = make_service(refresh_horizon=200)
    converse(svc)
    events = run(svc.regenerate())
    final = events[-1].turn
    assert final.used_recall and final.sibling_count == 2
    assert_state_matches_transcript(svc)


def test_a_recent_update_supersedes_the_faded_statement(make_service):
    svc = make_service(refresh_horizon=200)
    svc.new_session()
    run(svc.send(FACT))
    for _ in range(3):
        run(svc.send(CHATTER))
    run(svc.send("Update: my locker code is now 55555."))
    events = run(svc.send("What is my locker code?"))
    assert next(e for e in events if isinstance(e, TurnStarted)).recall_turn is None  # the state holds the update


def test_the_block_and_the_message_land_together_or_not_at_all(make_service, monkeypatch):
    import pytest

    from agent.chat.types import ChatError
    from sessions import SessionError

    svc = make_service(refresh_horizon=200)
    svc.new_session()
    run(svc.send(FACT))
    for _ in range(3):
        run(svc.send(CHATTER))
    head = svc.store.core.get_session(svc.session.uid).head_turn_id
    real = svc.store.turns.begin_turn

    def refuse_messages(*args, **kwargs):
        if kwargs.get("role") == "user":
            raise SessionError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(svc.store.turns, "begin_turn", refuse_messages)
    with pytest.raises(ChatError, match="disk full"):
        run(svc.send("What is my locker code?"))
    monkeypatch.undo()
    assert svc.store.core.get_session(svc.session.uid).head_turn_id == head
    assert svc.store.db.execute("SELECT count(*) FROM turns WHERE role = 'document'").fetchone()[0] == 0
    assert_state_matches_transcript(svc)
