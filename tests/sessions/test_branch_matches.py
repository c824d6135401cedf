"""`SessionStore.branch_matches`: the full-text candidates of recall refresh."""

from __future__ import annotations


def test_matches_stay_on_the_branch_and_skip_recall_blocks(store) -> None:
    s = store.turns.create_session(model_id="tiny", system_prompt="")
    a = store.turns.begin_turn(s.id, role="user", content="My locker code is 11111.", token_ids=[1, 2, 3])
    store.turns.begin_turn(s.id, role="user", content="Nice weather for the garden.", token_ids=[4, 5])
    # An edit of the first message makes a second branch; the head moves onto it.
    b = store.turns.edit_turn(a.id, content="My locker code is 22222.", token_ids=[1, 2, 4])
    recall = store.turns.begin_turn(s.id, role="document", content="Recalled: My locker code is 22222.", token_ids=[9])
    store.turns.commit_turn(recall.id, status="complete", token_ids=[9], stats={"kind": "recall"})
    doc = store.turns.begin_turn(s.id, role="document", content="notes.txt\n\nthe locker is blue", token_ids=[7])
    store.turns.commit_turn(doc.id, status="complete", token_ids=[7])

    ids = [t.id for t in store.browse.branch_matches(s.id, ["locker", "code"])]
    assert sorted(ids) == sorted([b.id, doc.id])  # not the other branch's turn, not the recall block
    # As of the edited message (before the document), only it matches.
    assert [t.id for t in store.browse.branch_matches(s.id, ["locker"], turn_id=b.id)] == [b.id]
    assert store.browse.branch_matches(s.id, ["garden"]) == []  # that turn is on the other branch
    assert store.browse.branch_matches(s.id, []) == []
    assert store.browse.branch_matches(s.id, ['"quoted', "code"])  # FTS syntax in words is taken literally


def test_ending_by_keeps_only_turns_that_end_early_enough(store) -> None:
    s = store.turns.create_session(model_id="tiny", system_prompt="")
    a = store.turns.begin_turn(s.id, role="user", content="the locker code", token_ids=[1] * 10)
    store.turns.begin_turn(s.id, role="user", content="the locker again", token_ids=[1] * 10)
    assert len(store.browse.branch_matches(s.id, ["locker"])) == 2
    assert [t.id for t in store.browse.branch_matches(s.id, ["locker"], ending_by=a.tokens_total)] == [a.id]
    assert store.browse.branch_matches(s.id, ["locker"], ending_by=a.tokens_total - 1) == []
