"""ChatService end to end on a real store and the tiny model.

The invariant under test everywhere: the live state (and every stored snapshot) equals a
fresh replay of the token ids stored for the branch, whatever ended the reply."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import torch

from agent.chat.types import ChatError, ProgressEvent, StateUnusableError, StatsEvent, TokenEvent, TurnFinished, TurnStarted
from agent.runtime.checkpoint import load_model
from agent.runtime.state import RecurrentState
from sessions import SessionStore


def replayed(svc) -> RecurrentState:
    state = svc.lm.model.new_state(1)
    for ids in svc.store.tree.branch_token_ids(svc.session.uid):
        if ids:
            _, state = svc.runner.prefill(ids, state)
    return state


def assert_state_matches_transcript(svc):
    live = svc._state_now()
    ref = replayed(svc)
    assert live.n_tokens == ref.n_tokens
    torch.testing.assert_close(live.gla, ref.gla, rtol=1e-5, atol=1e-6)
    head = svc.store.tree.get_turn(svc.store.core.get_session(svc.session.uid).head_turn_id)
    snap = svc.store.states.latest(svc.session.uid)
    stored = RecurrentState.from_bytes(svc.store.states.load(snap, expected_fingerprint=svc.lm.fingerprint))
    if snap.turn_id == head.id:
        torch.testing.assert_close(stored.gla, ref.gla, rtol=1e-5, atol=1e-6)


def run(events):
    return list(events)


def test_send_persists_user_first_then_reply_and_state(make_service):
    svc = make_service()
    svc.new_session(system="be brief")
    events = run(svc.send("hello there"))
    kinds = [type(e) for e in events]
    assert kinds[0] is TurnStarted and kinds[-2:] == [StatsEvent, TurnFinished]
    finished = events[-1].turn
    assert finished.status == "complete" and finished.role == "assistant"
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == finished.content
    roles = [(t.role, t.status) for t in svc.tail()]
    assert roles == [("system", "complete"), ("user", "complete"), ("assistant", "complete")]
    assert_state_matches_transcript(svc)
    st = svc.status()
    assert st.tokens_folded == svc.store.tree.get_turn(finished.id).tokens_total
    assert st.kv_cache_bytes == svc.lm.config.kv_cache_bytes(st.tokens_folded)


def test_cancel_mid_reply_keeps_text_and_state_in_agreement(make_service):
    svc = make_service(max_new_tokens=40)
    svc.new_session()
    cancel, seen = threading.Event(), 0
    for ev in svc.send("tell me a story", cancel):
        if isinstance(ev, TokenEvent):
            seen += 1
            if seen == 3:
                cancel.set()
        last = ev
    assert last.turn.status == "cancelled"
    assert_state_matches_transcript(svc)
    run(svc.send("and then?"))  # the session goes on from the cancelled reply
    assert_state_matches_transcript(svc)


def test_consumer_walking_away_commits_the_partial_reply(make_service):
    svc = make_service(max_new_tokens=40)
    svc.new_session()
    stream = svc.send("hi")
    for ev in stream:
        if isinstance(ev, TokenEvent):
            break
    stream.close()  # what Ctrl-C in `laplace ask` or a dropped worker does
    head = svc.store.tree.tail(svc.session.uid, 1)[0]
    assert head.role == "assistant" and head.status == "cancelled"
    assert_state_matches_transcript(svc)


def test_error_mid_reply_is_stored_and_the_session_recovers(make_service, monkeypatch):
    svc = make_service(max_new_tokens=20)
    svc.new_session()
    real_step, calls = svc.runner.step, {"n": 0}

    def flaky(tokens, state):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("device fell over")
        return real_step(tokens, state)

    monkeypatch.setattr(svc.runner, "step", flaky)
    last = run(svc.send("hi"))[-1]
    assert last.turn.status == "error" and last.turn.content
    monkeypatch.setattr(svc.runner, "step", real_step)
    assert run(svc.send("still there?"))[-1].turn.status == "complete"
    assert_state_matches_transcript(svc)


def test_resume_loads_the_stored_state_without_replaying(make_service, monkeypatch):
    svc = make_service()
    uid = svc.new_session(system="sys").uid
    for msg in ("one", "two", "three"):
        run(svc.send(msg))
    before = svc._state_now().clone()
    svc.close()
    other = make_service()
    folded = []
    real = other.runner.prefill
    monkeypatch.setattr(other.runner, "prefill", lambda ids, *a, **k: (folded.append(len(ids)), real(ids, *a, **k))[1])
    view = other.resume(uid[:6])
    assert view.uid == uid and view.turns == 6
    assert folded == []  # nothing re-read
    torch.testing.assert_close(other._state_now().gla, before.gla)


def test_resume_folds_a_user_turn_whose_reply_never_came(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("first"))
    ids = svc.lm.template.message(svc.lm.tokenizer, "user", "crashed before reply")
    svc.store.turns.begin_turn(uid, role="user", content="crashed before reply", token_ids=ids)
    svc.close()
    other = make_service()
    other.resume(uid)
    assert_state_matches_transcript(other)


def test_state_from_another_model_is_refused_and_rebuild_recovers(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("hello"))
    svc.close()
    other = make_service(model=load_model("tiny", seed=7))
    with pytest.raises(StateUnusableError, match="another model"):
        other.resume(uid)
    progress = [e for e in other.rebuild_state() if isinstance(e, ProgressEvent)]
    assert progress[-1].done == progress[-1].total > 0
    assert_state_matches_transcript(other)
    other.close()
    again = make_service(model=other.lm)
    again.resume(uid)  # the rebuilt snapshot now loads directly
    assert_state_matches_transcript(again)


def test_corrupt_stored_state_is_refused_and_rebuild_recovers(make_service, db_path):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("hello"))
    svc.close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE snapshot_data SET data = substr(data, 1, 100)")
    conn.commit()
    conn.close()
    other = make_service()
    with pytest.raises(StateUnusableError, match="corrupt"):
        other.resume(uid)
    run(other.rebuild_state())
    assert_state_matches_transcript(other)


def test_attach_folds_in_segments_and_bad_files_fail_clearly(make_service, tmp_path):
    svc = make_service()
    svc.new_session()
    doc = tmp_path / "notes.txt"
    doc.write_text("The locker code is 48213. " * 40, encoding="utf-8")
    events = run(svc.attach(doc))
    progress = [e.done for e in events if isinstance(e, ProgressEvent)]
    assert len(progress) > 3 and progress == sorted(progress)
    assert events[-1].turn.role == "document" and events[-1].turn.status == "complete"
    assert_state_matches_transcript(svc)
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("  ")
    for name, needle in [("missing.txt", "no such file"), ("bin.dat", "looks binary"),
                         ("latin1.txt", "not UTF-8"), ("empty.txt", "empty"), (".", "directory")]:
        with pytest.raises(ChatError, match=needle):
            run(svc.attach(tmp_path / name))


def test_cancelled_attach_leaves_the_state_as_it_was(make_service, tmp_path):
    svc = make_service()
    svc.new_session()
    before = svc._state_now().clone()
    doc = tmp_path / "long.txt"
    doc.write_text("word " * 2000)
    cancel = threading.Event()
    for ev in svc.attach(doc, cancel):
        if isinstance(ev, ProgressEvent):
            cancel.set()
        last = ev
    assert last.turn.status == "cancelled"
    torch.testing.assert_close(svc._state_now().gla, before.gla)
    assert_state_matches_transcript(svc)


def test_probe_asks_a_copy_and_changes_nothing(make_service):
    svc = make_service()
    svc.new_session()
    run(svc.send("my locker code is 48213"))
    state_before, turns_before = svc._state_now().clone(), len(svc.tail())
    answer = svc.probe("what is my locker code?", "48213")
    assert answer.verdict in {"REMEMBERED", "WEAK", "FORGOTTEN", "UNDETERMINED"} and answer.expected == "48213"
    assert svc.probe("anything?").verdict is None
    torch.testing.assert_close(svc._state_now().gla, state_before.gla)
    assert len(svc.tail()) == turns_before


def test_probe_judges_by_the_same_rule_as_probe_session(make_service):
    """/probe and `laplace probe session` share one rule: same state, same verdict and reason."""
    from agent.probes.session_check import check_state

    svc = make_service()
    svc.new_session()
    run(svc.send("my locker code is 48213"))
    answer = svc.probe("what is my locker code?", "48213")
    check = check_state(svc.lm, svc._state_now().clone(), "what is my locker code?", expect="48213")
    assert (answer.verdict, answer.detail, answer.answer) == (check.verdict, check.reason, check.answer)
    assert check.rank is not None and check.reason
    with pytest.raises(ChatError, match="expected answer is empty"):
        svc.probe("what is my locker code?", "  ")


def test_regenerate_adds_a_sibling_and_keeps_the_old_reply(make_service):
    svc = make_service()
    svc.new_session()
    first = run(svc.send("hi"))[-1].turn
    second = run(svc.regenerate())[-1].turn
    assert second.parent_id == first.parent_id and second.id != first.id
    assert (second.sibling_index, second.sibling_count) == (1, 2)
    assert second.content != first.content  # a fixed seed is varied per sibling
    assert svc.store.tree.get_turn(first.id).content == first.content
    assert_state_matches_transcript(svc)


def test_switching_versions_moves_the_branch_and_its_state(make_service):
    svc = make_service()
    svc.new_session()
    first = run(svc.send("hi"))[-1].turn
    run(svc.send("on the first branch"))
    second = run(svc.regenerate())[-1].turn  # a sibling of the *last* reply
    back = svc.switch_sibling(second.id, -1)
    assert back.parent_id == second.parent_id and back.id != second.id
    assert svc.tail()[-1].id == back.id  # the head is that branch's leaf
    assert_state_matches_transcript(svc)
    with pytest.raises(ChatError, match="no other versions"):
        svc.switch_sibling(first.id, 1)
    svc.switch_sibling(back.id, 1)
    assert svc.tail()[-1].id == second.id
    assert_state_matches_transcript(svc)


def test_fork_copies_the_branch_and_its_state(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("hi"))
    state = svc._state_now().clone()
    forked = svc.fork()
    assert forked.uid != uid and forked.turns == 2
    torch.testing.assert_close(svc._state_now().gla, state.gla)
    run(svc.send("only in the fork"))
    assert svc.store.browse.summary(uid).turns == 2


def test_second_writer_gets_session_in_use(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    other = make_service()
    with pytest.raises(ChatError, match="in use"):
        other.resume(uid)


def test_options_validate_and_persist(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    svc.set_option("temperature", "0")
    with pytest.raises(ChatError, match="unknown sampling option"):
        svc.set_option("warp", "9")
    svc.close()
    other = make_service(given={})  # nothing given at the edge: the stored value
    other.resume(uid)
    assert other.options.sampling.temperature == 0


def test_non_utf8_message_is_refused(make_service):
    svc = make_service()
    svc.new_session()
    with pytest.raises(ChatError, match="UTF-8"):
        run(svc.send("bad \udcff surrogate"))
    assert len(svc.tail()) == 1  # nothing stored


def test_huge_paste_is_stored_whole(make_service):
    svc = make_service(max_new_tokens=2)
    svc.new_session()
    big = "x" * 30_000
    last = run(svc.send(big))[-1]
    user = svc.store.tree.get_turn(last.turn.parent_id)
    assert user.content == big and user.n_tokens == 30_000 + 3


def test_a_new_session_stores_the_options_it_runs_with(make_service):
    """/set temperature 0.2, then /new: the new session runs at the given 0.8, and stores and
    resumes with 0.8, not the old session's 0.2 (it stored that before resetting)."""
    svc = make_service()  # given at the edge: temperature 0.8, seed 1, max_new_tokens 12
    svc.new_session()
    svc.set_option("temperature", "0.2")
    uid = svc.new_session().uid
    assert svc.options.sampling.temperature == 0.8
    assert svc.store.core.get_session(uid).options == {"temperature": 0.8, "seed": 1, "max_new_tokens": 12}
    svc.close()
    plain = make_service(given={})  # nothing given at the edge: what the session stored
    plain.resume(uid)
    assert plain.options.sampling.temperature == 0.8


def test_options_are_stored_typed_and_edge_values_apply_once(make_service):
    svc = make_service(stop=["END"])
    uid = svc.new_session().uid
    svc.set_option("top_p", "0.5")
    svc.set_option("refresh", "off")
    stored = svc.store.core.get_session(uid).options
    assert stored == {"temperature": 0.8, "seed": 1, "max_new_tokens": 12, "stop": ["END"], "top_p": 0.5, "refresh": False}
    svc.close()
    again = make_service(stop=["END"], temperature=0.3)  # the edge's values go on top of the stored ones
    again.resume(uid)
    assert again.options.sampling.stop == ("END",) and again.options.sampling.top_p == 0.5
    assert again.store.core.get_session(uid).options["temperature"] == 0.3


def test_an_older_database_s_text_options_resume_and_are_stored_typed(make_service, db_path):
    svc = make_service()
    uid = svc.new_session().uid
    svc.close()
    with SessionStore.open(db_path) as store:  # the shape an older laplace wrote
        store.turns.set_options(uid, {"temperature": "0.2", "top_k": "5", "refresh": "False", "seed": "None"})
    again = make_service()
    again.resume(uid)
    assert again.options.sampling.top_k == 5 and again.options.refresh.on is False
    assert again.store.core.get_session(uid).options == {"temperature": 0.8, "seed": 1, "max_new_tokens": 12, "top_k": 5,
                                                     "refresh": False}
