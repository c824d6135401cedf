"""What `ChatService` does when it takes a session that a crash or an edit left behind:
an interrupted reply's kept text is folded into the state; an edited token stream is
refused on resume and repaired by a rebuild."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from agent.chat.types import StateUnusableError
from agent.runtime.state import RecurrentState

from .test_chat_service import assert_state_matches_transcript, run


def crash_mid_reply(svc, uid: str, partial: str) -> int:
    """What a writer killed mid-reply leaves: the user turn, and a streaming reply holding
    the text flushed so far and no token ids. Returns the reply's turn id."""
    ids = svc.lm.template.message(svc.lm.tokenizer, "user", "tell me more")
    svc.store.turns.begin_turn(uid, role="user", content="tell me more", token_ids=ids)
    reply = svc.store.turns.begin_turn(uid, role="assistant")
    svc.store.turns.update_streaming(reply.id, partial)
    return reply.id


def test_resume_folds_the_kept_text_of_an_interrupted_reply(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("first"))
    svc.close()  # the lease is gone, as after a SIGKILL; the store writes without one
    reply_id = crash_mid_reply(svc, uid, "The answer is 42 and")

    other = make_service()
    other.resume(uid)
    turn = other.store.tree.get_turn(reply_id)
    assert turn.status == "cancelled" and turn.content == "The answer is 42 and"
    tok, tpl = other.lm.tokenizer, other.lm.template
    ids = other.store.tree.turn_token_ids(reply_id)
    assert ids == [*tpl.reply_prefix(tok), *tok.encode("The answer is 42 and"), *tpl.reply_suffix(tok)]
    # The state has read exactly the stored text, and that state was committed with it.
    assert other.store.states.latest(uid).turn_id == reply_id
    assert_state_matches_transcript(other)
    run(other.send("and then?"))
    assert_state_matches_transcript(other)


def test_fork_of_a_crashed_session_folds_the_kept_text(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("first"))
    svc.close()
    crash_mid_reply(svc, uid, "half a rep")
    forked = svc.store.browse.fork(uid)  # `laplace sessions fork` runs without a model

    other = make_service()
    other.resume(forked.uid)
    head = other.store.tree.get_turn(other.store.core.get_session(forked.uid).head_turn_id)
    assert head.status == "cancelled" and head.n_tokens > 0
    assert_state_matches_transcript(other)


def test_an_interrupted_reply_is_folded_once(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("first"))
    svc.close()
    reply_id = crash_mid_reply(svc, uid, "partial")
    first = make_service()
    first.resume(uid)
    state = first._state_now().clone()
    first.close()
    again = make_service()
    again.resume(uid)
    assert again.store.tree.get_turn(reply_id).n_tokens == first.store.tree.get_turn(reply_id).n_tokens
    assert isinstance(again._state_now(), RecurrentState)
    torch.testing.assert_close(again._state_now().gla, state.gla)


def edit_token_ids(db_path, turn_id: int, ids: list[int]) -> None:
    """Change a stored turn's token ids in place, leaving its recorded hashes as they were."""
    from sessions import pack_ids

    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE turns SET token_ids = ? WHERE id = ?", [pack_ids(ids), turn_id])
    conn.commit()
    conn.close()


def test_resume_notices_an_edited_earlier_turn_and_rebuild_repairs_it(make_service, db_path):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("my code is 48213"))
    run(svc.send("and the weather?"))
    first_user = svc.store.tree.branch(uid)[1]
    svc.close()
    tok, tpl = svc.lm.tokenizer, svc.lm.template
    edit_token_ids(db_path, first_user.id, tpl.message(tok, "user", "my code is 99999"))

    other = make_service()
    with pytest.raises(StateUnusableError) as err:
        other.resume(uid)
    msg = str(err.value)
    assert f"turn {first_user.id}" in msg and "hash chain" in msg and "--rebuild-state" in msg and "\n" not in msg
    run(other.rebuild_state())
    assert_state_matches_transcript(other)  # the state read the ids as they are now stored
    other.close()
    again = make_service()
    again.resume(uid)  # the chain was recomputed, so the next resume passes
    assert_state_matches_transcript(again)


def test_a_crashed_reply_over_an_unusable_state_is_folded_by_the_rebuild(make_service, db_path):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("first"))
    svc.close()
    reply_id = crash_mid_reply(svc, uid, "cut off here")
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE snapshot_data SET data = substr(data, 1, 100)")
    conn.commit()
    conn.close()

    other = make_service()
    with pytest.raises(StateUnusableError, match="corrupt"):
        other.resume(uid)
    assert other.store.tree.get_turn(reply_id).n_tokens == 0  # nothing written without a state to fold into
    run(other.rebuild_state())
    assert other.store.tree.get_turn(reply_id).n_tokens > 0
    assert other.store.states.latest(uid).turn_id == reply_id
    assert_state_matches_transcript(other)
