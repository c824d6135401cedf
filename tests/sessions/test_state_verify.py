"""Verify on load: corrupt, truncated, foreign-model and mismatched states, and the replay way out."""

from __future__ import annotations

import pytest

from sessions import (
    GENESIS_HASH, SessionStore, StateChecksumError, StateError, StateMeta, StateModelMismatch,
    StateTranscriptMismatch, chain_hash,
)

from .conftest import FINGERPRINT, converse, fake_state, meta, tokens_of


@pytest.fixture
def chat(store: SessionStore):
    s = store.turns.create_session(model_id="tiny", system_token_ids=tokens_of("sys"))
    for i in range(4):
        converse(store, s.id, f"message {i}", size=8192)
    return s


def replay(store: SessionStore, session_id: int) -> None:
    """What the chat service does on a StateError: fold the branch's tokens into a fresh state."""
    h = GENESIS_HASH
    for ids in store.tree.branch_token_ids(session_id):
        h = chain_hash(h, ids)
    head = store.core.get_session(session_id).head_turn_id
    store.states.put(head, fake_state(h, 8192), meta(stream_hash=h))


def _corrupt(store: SessionStore, sql: str) -> None:
    with store.core.transaction():
        store.db.execute(sql)


CORRUPTIONS = {
    "flipped_byte": (("UPDATE snapshot_data SET data = CAST(substr(data, 1, 100) || CASE WHEN substr(data, 101, 1) = X'FF'"
                      " THEN X'00' ELSE X'FF' END || substr(data, 102) AS BLOB)"),
                     StateChecksumError, "sha256 mismatch"),
    "truncated": ("UPDATE snapshot_data SET data = substr(data, 1, 1000)", StateChecksumError, "bytes stored"),
    "other_model": ("UPDATE state_snapshots SET model_fingerprint = 'fp-3b-9999'", StateModelMismatch,
                    "another model"),
    "wrong_transcript": ("UPDATE state_snapshots SET stream_hash = '" + "e" * 64 + "'",
                         StateTranscriptMismatch, "disagrees with the transcript"),
    "wrong_token_count": ("UPDATE state_snapshots SET n_tokens = n_tokens - 1", StateTranscriptMismatch,
                          "tokens"),
}


@pytest.mark.parametrize("case", CORRUPTIONS, ids=str)
def test_each_corruption_has_its_clear_error_and_replay_recovers(store: SessionStore, chat, case: str) -> None:
    sql, error, words = CORRUPTIONS[case]
    # Only the newest snapshot is damaged so the error is the one a resume would hit.
    newest = store.states.latest(chat.id)
    _corrupt(store, sql + (" WHERE snapshot_id = " if "snapshot_data" in sql else " WHERE id = ") + str(newest.id))
    with pytest.raises(error) as err:
        store.states.resume(chat.uid, expected_fingerprint=FINGERPRINT)
    msg = str(err.value)
    assert words in msg and "\n" not in msg
    assert chat.uid[:8] in msg and "--rebuild-state" in msg and "replaying the transcript" in msg
    replay(store, chat.id)
    r = store.states.resume(chat.uid, expected_fingerprint=FINGERPRINT)
    assert r.state == fake_state(r.head.stream_hash, 8192)


def test_loading_with_another_models_fingerprint_fails(store: SessionStore, chat) -> None:
    with pytest.raises(StateModelMismatch, match="fingerprint fp-tiny-0001"):
        store.states.resume(chat.id, expected_fingerprint="fp-3b-9999")


def test_storing_a_state_for_the_wrong_transcript_is_refused(store: SessionStore, chat) -> None:
    head = store.tree.get_turn(store.core.get_session(chat.id).head_turn_id)
    with pytest.raises(StateTranscriptMismatch, match="folded 3 tokens"):
        store.states.put(head.id, b"x", StateMeta(model_fingerprint=FINGERPRINT, n_tokens=3))
    with pytest.raises(StateTranscriptMismatch, match="hash"):
        store.states.put(head.id, b"x", meta(stream_hash=GENESIS_HASH))
    s = store.turns.begin_turn(chat.id, role="user", content="x", token_ids=[1])
    a = store.turns.begin_turn(chat.id, role="assistant")
    with pytest.raises(StateError, match="still streaming"):
        store.states.put(a.id, b"x", meta())
    assert s.status == "complete"


def test_deep_verify_catches_a_tampered_token_blob(store: SessionStore, chat) -> None:
    assert store.states.verify_branch(chat.id) == 9
    store.states.resume(chat.id, expected_fingerprint=FINGERPRINT)  # shallow check cannot see it...
    turn_id = store.tree.branch(chat.id)[3].id
    _corrupt(store, f"UPDATE turns SET token_ids = X'01000000' WHERE id = {turn_id}")
    with pytest.raises(StateTranscriptMismatch) as err:  # ...the deep one does
        store.states.verify_branch(chat.id)
    assert err.value.turn_id == turn_id


def test_chain_check_names_the_edited_turn_and_rechain_repairs_it(store: SessionStore, chat) -> None:
    total = store.chain.check_chain(chat.id)
    assert total == store.tree.get_turn(store.core.get_session(chat.id).head_turn_id).tokens_total
    branch = store.tree.branch(chat.id)
    edited = branch[3]
    other = store.turns.edit_turn(branch[5].id, content="a sibling", token_ids=tokens_of("a sibling"))
    store.turns.set_head(chat.id, branch[-1].id, descend=False)
    _corrupt(store, f"UPDATE turns SET token_ids = X'0100000002000000' WHERE id = {edited.id}")
    with pytest.raises(StateTranscriptMismatch) as err:
        store.chain.check_chain(chat.id)
    assert err.value.turn_id == edited.id and "--rebuild-state" in str(err.value)
    store.chain.check_chain(chat.id, branch[2].id)  # a branch that stops before the edit is fine
    before = len(store.states.all(chat.id))
    fixed, dropped = store.chain.rechain(chat.id)
    # The edited turn and everything after it (branch[3:] and the sibling of branch[5]), and
    # the snapshots they invalidated.
    assert fixed == len(branch[3:]) + 1 and dropped == before - len(store.states.all(chat.id)) > 0
    assert store.chain.check_chain(chat.id) == total - len(tokens_of("message 1")) + 2
    assert store.chain.check_chain(chat.id, other.id) == store.tree.get_turn(other.id).tokens_total
    assert all(s.turn_id not in {t.id for t in branch[3:]} for s in store.states.all(chat.id))
    assert store.chain.rechain(chat.id) == (0, 0)
    replay(store, chat.id)
    assert store.states.verify_branch(chat.id) == len(branch)


def test_a_token_blob_that_is_not_whole_ids_is_refused_wherever_it_is_read(store: SessionStore, chat) -> None:
    from sessions import DamagedTokenIds

    user = store.tree.branch(chat.id)[3]
    _corrupt(store, f"UPDATE turns SET token_ids = substr(token_ids, 1, length(token_ids) - 1) WHERE id = {user.id}")
    rows = store.db.execute("SELECT id, stream_hash, tokens_total, n_tokens FROM turns ORDER BY id").fetchall()
    snaps = store.db.execute("SELECT id FROM state_snapshots ORDER BY id").fetchall()
    way_out = f"laplace sessions fork {chat.uid[:8]} --at {user.parent_id}"
    for read in (lambda: store.tree.turn_token_ids(user.id), lambda: list(store.tree.branch_token_ids(chat.id)),
                 lambda: store.chain.check_chain(chat.id), lambda: store.chain.rechain(chat.id),
                 lambda: store.states.verify_branch(chat.id)):
        with pytest.raises(DamagedTokenIds) as err:
            read()
        assert f"turn {user.id}" in str(err.value) and way_out in str(err.value) and "\n" not in str(err.value)
    assert store.db.execute("SELECT id, stream_hash, tokens_total, n_tokens FROM turns ORDER BY id").fetchall() == rows
    assert store.db.execute("SELECT id FROM state_snapshots ORDER BY id").fetchall() == snaps


def test_rechain_leaves_a_damaged_turn_on_another_branch_alone(store: SessionStore, chat) -> None:
    old = store.tree.get_turn(store.core.get_session(chat.id).head_turn_id)
    new = store.turns.regenerate(old.id)
    store.turns.commit_turn(new.id, content="again", token_ids=tokens_of("again"))
    _corrupt(store, f"UPDATE turns SET token_ids = X'0102' WHERE id = {old.id}")
    _corrupt(store, f"UPDATE turns SET stream_hash = 'x' WHERE id = {store.tree.branch(chat.id)[2].id}")
    before = store.db.execute("SELECT stream_hash, tokens_total FROM turns WHERE id = ?", [old.id]).fetchone()
    fixed, _ = store.chain.rechain(chat.id)  # the head's branch is whole: it is repaired
    assert fixed >= 1 and store.chain.check_chain(chat.id) > 0
    assert store.db.execute("SELECT stream_hash, tokens_total FROM turns WHERE id = ?", [old.id]).fetchone() == before
