"""Store semantics: turns, streaming, heads and branches, paging, fork, retention, delete, search."""

from __future__ import annotations

import sqlite3

import pytest

from sessions import (
    GENESIS_HASH, AmbiguousSessionId, InvalidTurnOperation, SessionNotFound, SessionStore, chain_hash,
)

from .conftest import FINGERPRINT, converse, fake_state, meta, tokens_of


def new_session(store: SessionStore, **kw: object):
    return store.turns.create_session(model_id="tiny", system_prompt="You are terse.",
                                system_token_ids=tokens_of("You are terse."), **kw)


def test_turn_chain_and_token_accounting(store: SessionStore) -> None:
    s = new_session(store)
    a = converse(store, s.id, "hello", "hi")
    ids = list(store.tree.branch_token_ids(s.id))
    assert ids == [tokens_of("You are terse."), tokens_of("hello"), tokens_of("hi")]
    h = GENESIS_HASH
    for chunk in ids:
        h = chain_hash(h, chunk)
    assert a.stream_hash == h
    assert a.tokens_total == sum(map(len, ids))
    assert a.token_start == a.tokens_total - len(tokens_of("hi"))
    assert store.core.get_session(s.id).head_turn_id == a.id
    assert store.states.verify_branch(s.id) == 3


def test_user_row_is_written_before_generation_and_streaming_flushes(store: SessionStore, db_path) -> None:
    s = new_session(store)
    u = store.turns.begin_turn(s.id, role="user", content="question?", token_ids=[1, 2])
    a = store.turns.begin_turn(s.id, role="assistant")
    store.turns.update_streaming(a.id, "partial ans")
    # Another connection (a reader) sees the user turn complete and the partial reply.
    with SessionStore.open(db_path, readonly=True) as reader:
        assert reader.tree.get_turn(u.id).status == "complete"
        seen = reader.tree.get_turn(a.id)
        assert (seen.status, seen.content) == ("streaming", "partial ans")
        assert reader.states.latest(s.id) is None
    with pytest.raises(InvalidTurnOperation):
        store.turns.begin_turn(s.id, role="user", content="too early")  # parent still streaming
    t = store.turns.commit_turn(a.id, content="partial", status="cancelled", token_ids=[7],
                          state=b"s" * 10, state_meta=meta())
    assert t.status == "cancelled" and t.content == "partial"
    assert store.states.latest(s.id).turn_id == a.id
    with pytest.raises(InvalidTurnOperation):
        store.turns.update_streaming(a.id, "more")


def test_commit_refuses_to_rewrite_tokens_under_children(store: SessionStore) -> None:
    s = new_session(store)
    a = converse(store, s.id, "one")
    converse(store, s.id, "two")
    with pytest.raises(InvalidTurnOperation):
        store.turns.commit_turn(a.id, token_ids=[9, 9, 9])
    store.turns.commit_turn(a.id, token_ids=store.tree.turn_token_ids(a.id))  # same ids: fine
    with pytest.raises(InvalidTurnOperation):
        store.turns.commit_turn(a.id, status="streaming")


def test_regenerate_and_edit_make_siblings_and_move_head(store: SessionStore) -> None:
    s = new_session(store)
    first = converse(store, s.id, "q", "answer one")
    regen = store.turns.regenerate(first.id)
    assert regen.parent_id == first.parent_id and regen.status == "streaming"
    store.turns.commit_turn(regen.id, content="answer two", token_ids=tokens_of("answer two"))
    assert [t.id for t in store.tree.siblings(first.id)] == [first.id, regen.id]
    assert store.core.get_session(s.id).head_turn_id == regen.id
    user = store.tree.get_turn(first.parent_id)
    edited = store.turns.edit_turn(user.id, content="q edited", token_ids=tokens_of("q edited"))
    assert edited.parent_id == user.parent_id and edited.role == "user"
    assert [t.content for t in store.tree.tail(s.id)][-1] == "q edited"
    # Switching back to the first branch descends to its newest leaf.
    head = store.turns.set_head(s.id, user.id)
    assert head.id == regen.id
    assert [t.content for t in store.tree.tail(s.id)] == ["You are terse.", "q", "answer two"]
    with pytest.raises(InvalidTurnOperation):
        store.turns.edit_turn(store.tree.branch(s.id)[0].id, content="x")


def test_paging_along_the_branch(store: SessionStore) -> None:
    s = new_session(store)
    with store.core.transaction():
        for i in range(30):
            converse(store, s.id, f"m{i}", f"r{i}", size=64)
    tail = store.tree.tail(s.id, 5)
    assert [t.content for t in tail] == ["r27", "m28", "r28", "m29", "r29"]
    page = store.tree.page_before(s.id, tail[0].id, 4)
    assert [t.content for t in page] == ["r25", "m26", "r26", "m27"]
    first = store.tree.page_before(s.id, store.tree.branch(s.id)[2].id, 10)
    assert [t.role for t in first] == ["system", "user"]
    assert store.tree.page_before(s.id, store.tree.branch(s.id)[0].id, 10) == []
    r = store.states.resume(s.id, tail=5, expected_fingerprint=FINGERPRINT)
    assert r.has_older and r.head.content == "r29" and r.tokens_to_fold == 0


def test_spans_of_turns_read_in_batches_and_only_from_the_session(store: SessionStore, monkeypatch) -> None:
    import sessions.store_tree as tree

    monkeypatch.setattr(tree, "_BATCH", 3)  # several batches from a few turns
    s, other = new_session(store), new_session(store)
    with store.core.transaction():
        for i in range(4):
            converse(store, s.id, f"m{i}", f"r{i}", size=64)
        foreign = converse(store, other.id, "elsewhere", size=64)
    branch = store.tree.branch(s.id)
    asked = [t.id for t in reversed(branch)] + [foreign.id, 10**6, branch[0].id]
    assert store.tree.spans(s.id, asked) == {t.id: (t.token_start, t.tokens_total) for t in branch}
    assert store.tree.spans(s.id, []) == {}


def test_resume_reports_tokens_still_to_fold(store: SessionStore) -> None:
    s = new_session(store)
    a = converse(store, s.id, "x")
    u = store.turns.begin_turn(s.id, role="user", content="unanswered", token_ids=[1, 2, 3])
    r = store.states.resume(s.id, expected_fingerprint=FINGERPRINT)
    assert r.snapshot.turn_id == a.id and r.head.id == u.id and r.tokens_to_fold == 3
    assert list(store.tree.branch_token_ids(s.id, after_turn_id=a.id)) == [[1, 2, 3]]


def test_retention_keeps_latest_per_branch_plus_n_older(store: SessionStore) -> None:
    s = new_session(store, keep_snapshots=1)
    turns = [converse(store, s.id, f"m{i}") for i in range(5)]
    assert [x.turn_id for x in store.states.all(s.id)] == [turns[4].id, turns[3].id]
    # A sibling branch off turn 2's user: the old branch keeps its latest snapshot.
    store.turns.set_head(s.id, turns[2].id, descend=False)
    alt = [converse(store, s.id, f"alt{i}") for i in range(3)]
    kept = {x.turn_id for x in store.states.all(s.id)}
    # alt0 fell out of the new branch; the old branch's snapshots are not on this path.
    assert kept == {turns[4].id, turns[3].id, alt[2].id, alt[1].id}
    store.states.set_keep(s.id, 0)
    # Pruning applies to the branch being written; the other branch is pruned when it is.
    assert {x.turn_id for x in store.states.all(s.id)} == {alt[2].id, turns[4].id, turns[3].id}
    n_blobs = store.db.execute("SELECT count(*) FROM snapshot_data").fetchone()[0]
    assert n_blobs == 3  # the BLOBs went with their rows
    assert store.states.resume(s.id, expected_fingerprint=FINGERPRINT).snapshot.turn_id == alt[2].id


def test_fork_copies_branch_and_state(store: SessionStore) -> None:
    s = new_session(store, name="orig")
    a = converse(store, s.id, "one")
    converse(store, s.id, "two")
    f = store.browse.fork(s.uid[:6], a.id)
    assert f.forked_from_session_id == s.id and f.name == "orig (fork)"
    assert [t.content for t in store.tree.branch(f.id)] == ["You are terse.", "one", "re: one"]
    r = store.states.resume(f.id, expected_fingerprint=FINGERPRINT)
    assert r.state == fake_state(a.stream_hash) and r.head.stream_hash == a.stream_hash
    converse(store, f.id, "diverge")
    assert len(store.tree.branch(s.id)) == 5 and len(store.tree.branch(f.id)) == 5
    assert store.states.verify_branch(f.id) == 5


def test_prefix_resolution(store: SessionStore) -> None:
    made = [new_session(store) for _ in range(20)]
    s = made[0]
    assert store.core.get_session(s.uid[:10]).id == s.id
    with pytest.raises(SessionNotFound):
        store.core.get_session("")
    with pytest.raises(SessionNotFound):
        store.core.get_session("zz-not-hex")
    # with 20 sessions some one-hex-digit prefix is shared by two of them
    firsts = [m.uid[0] for m in made]
    dup = next(c for c in firsts if firsts.count(c) > 1)
    with pytest.raises(AmbiguousSessionId) as err:
        store.core.get_session(dup)
    assert "type more" in str(err.value) and len(err.value.candidates) >= 2
    assert all(c.startswith(dup) for c in err.value.candidates)


def test_delete_removes_rows_text_and_snapshots(store: SessionStore, db_path) -> None:
    keep = new_session(store)
    converse(store, keep.id, "keep me")
    gone = new_session(store)
    # long enough to live in overflow pages, which only full secure_delete zeroes
    converse(store, gone.id, "zebrafishsecret " * 600, size=200_000)
    store.browse.delete_session(gone.uid)
    with pytest.raises(SessionNotFound):
        store.core.get_session(gone.id)
    counts = [store.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("turns", "state_snapshots", "snapshot_data")]
    assert counts == [3, 1, 1]
    assert store.browse.search("zebrafishsecret") == []
    assert store.browse.search("keep")[0].session_uid == keep.uid
    raw = db_path.read_bytes() + (db_path.with_name(db_path.name + "-wal").read_bytes()
                                  if db_path.with_name(db_path.name + "-wal").exists() else b"")
    assert b"zebrafishsecret" not in raw


def test_search_quotes_user_text_and_hides_archived(store: SessionStore) -> None:
    s = new_session(store)
    converse(store, s.id, 'what about "quoted" AND-stuff (parens)?')
    assert store.browse.search('"quoted" AND-stuff (parens')  # no FTS syntax error
    store.turns.set_archived(s.id)
    assert store.browse.search("quoted") == []
    assert store.browse.search("quoted", include_archived=True)[0].role == "user"
    assert store.browse.list_sessions() == [] and len(store.browse.list_sessions(include_archived=True)) == 1


def test_export_json_and_markdown(store: SessionStore) -> None:
    s = new_session(store, name="notes")
    converse(store, s.id, "hello", "hi there")
    data = store.browse.export_json(s.id)
    assert data["session"]["uid"] == s.uid
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("system", "You are terse."), ("user", "hello"), ("assistant", "hi there")]
    md = store.browse.export_markdown(s.id)
    assert md.startswith("# notes") and "## assistant\n\nhi there" in md


def test_runs_tables(store: SessionStore) -> None:
    s = new_session(store)
    run = store.browse.add_probe_run(model_id="tiny", suite="needle", payload={"acc": 0.5}, session=s.id)
    assert store.browse.list_probe_runs(session=s.id)[0].payload == {"acc": 0.5} and run.kind == "needle"
    store.browse.add_finetune_run(model_id="tiny", kind="muon", payload={"steps": 3})
    assert store.browse.list_finetune_runs()[0].payload["steps"] == 3
    store.browse.delete_session(s.id)
    assert store.browse.list_probe_runs()[0].session_id is None  # runs outlive their session


def test_database_is_private_and_pragmas_set(store: SessionStore, db_path) -> None:
    new_session(store)
    assert db_path.stat().st_mode & 0o777 == 0o600
    assert db_path.parent.stat().st_mode & 0o777 == 0o700
    for suffix in ("-wal", "-shm"):
        side = db_path.with_name(db_path.name + suffix)
        assert side.stat().st_mode & 0o777 == 0o600
    conn = store.db.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0


def test_readonly_store_cannot_write_or_change_the_file(store: SessionStore, db_path) -> None:
    s = new_session(store)
    with SessionStore.open(db_path, readonly=True) as ro:
        assert ro.core.get_session(s.id).uid == s.uid
        with pytest.raises(Exception):
            ro.turns.rename_session(s.id, "nope")
        with pytest.raises(sqlite3.OperationalError):
            ro.db.execute("UPDATE sessions SET name = 'x'")
