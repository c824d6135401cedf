"""Two processes on one session (leases), and readers during writes (never blocked)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from sessions import SessionInUse, SessionStore

from .conftest import converse, tokens_of

ctx = mp.get_context("fork")


def _hold_lease(db_path: str, uid: str, ready, release) -> None:
    with SessionStore.open(db_path) as store:
        lease = store.leases.acquire(uid)
        converse(store, uid, "from the child")
        ready.set()
        release.wait(30)
        lease.release()


def _hold_write_transaction(db_path: str, uid: str, ready, release) -> None:
    store = SessionStore.open(db_path)
    with store.core.transaction():
        store.turns.begin_turn(uid, role="user", content="uncommitted words", token_ids=[1])
        converse(store, uid, "more uncommitted", size=5_000_000)
        ready.set()
        release.wait(30)
        raise SystemExit(0)  # roll back: the reader must never have seen any of it


@pytest.fixture
def session_uid(store: SessionStore) -> str:
    s = store.turns.create_session(model_id="tiny", system_token_ids=tokens_of("sys"))
    converse(store, s.id, "first")
    return s.uid


def test_second_writer_gets_session_in_use_naming_the_holder(db_path: Path, store: SessionStore,
                                                             session_uid: str) -> None:
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lease, args=(str(db_path), session_uid, ready, release))
    child.start()
    try:
        assert ready.wait(20)
        with pytest.raises(SessionInUse) as err:
            store.leases.acquire(session_uid)
        assert f"pid {child.pid}" in str(err.value) and "lease expires in" in str(err.value)
        with pytest.raises(SessionInUse):
            store.turns.begin_turn(session_uid, role="user", content="sneaky")
        with pytest.raises(SessionInUse):
            store.browse.delete_session(session_uid)
        # Readers need no lease and see the child's committed turn.
        assert store.tree.tail(session_uid)[-1].content == "re: from the child"
        assert store.leases.holder(session_uid).pid == child.pid
    finally:
        release.set()
        child.join(20)
    with store.leases.acquire(session_uid):
        converse(store, session_uid, "mine now")


def test_a_killed_holder_does_not_keep_the_session(db_path: Path, store: SessionStore, session_uid: str) -> None:
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lease, args=(str(db_path), session_uid, ready, release))
    child.start()
    assert ready.wait(20)
    os.kill(child.pid, signal.SIGKILL)
    child.join(20)
    with store.leases.acquire(session_uid):  # dead pid on this host: stale at once
        converse(store, session_uid, "after the crash")


def test_lease_expires_without_heartbeat(db_path: Path, session_uid: str) -> None:
    now = [1000.0]
    a = SessionStore.open(db_path, lease_ttl_s=30, clock=lambda: now[0])
    b = SessionStore.open(db_path, lease_ttl_s=30, clock=lambda: now[0])
    try:
        lease = a.leases.acquire(session_uid)
        now[0] += 20
        lease.heartbeat()
        now[0] += 20  # 40 s after acquiring, but only 20 s after the heartbeat
        with pytest.raises(SessionInUse, match="expires in 10s"):
            b.leases.acquire(session_uid)
        now[0] += 11
        b.leases.acquire(session_uid)
        with pytest.raises(SessionInUse):
            lease.heartbeat()  # a holder that lost its lease learns it on the next heartbeat
        with pytest.raises(SessionInUse):
            a.turns.begin_turn(session_uid, role="user", content="late")
    finally:
        a.close()
        b.close()


def test_streaming_turn_of_a_dead_writer_becomes_cancelled_on_next_lease(store: SessionStore,
                                                                        session_uid: str) -> None:
    store.turns.begin_turn(session_uid, role="user", content="q", token_ids=[1])
    a = store.turns.begin_turn(session_uid, role="assistant")
    store.turns.update_streaming(a.id, "half a rep")
    store.leases.acquire(session_uid).release()
    t = store.tree.get_turn(a.id)
    assert (t.status, t.content) == ("cancelled", "half a rep") and "interrupted" in t.error


def test_readers_are_not_blocked_by_a_writer(db_path: Path, store: SessionStore, session_uid: str) -> None:
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_write_transaction, args=(str(db_path), session_uid, ready, release))
    child.start()
    try:
        assert ready.wait(20)
        with SessionStore.open(db_path, readonly=True) as reader:
            t0 = time.perf_counter()
            tail = reader.tree.tail(session_uid)
            r = reader.states.resume(session_uid)
            listing = reader.browse.list_sessions()
            elapsed = time.perf_counter() - t0
        assert elapsed < 1.0  # the busy timeout is 10 s: a blocked reader would wait it out
        assert tail[-1].content == "re: first" and r.state is not None and len(listing) == 1
        assert store.browse.search("uncommitted") == []
    finally:
        release.set()
        child.join(20)
    assert store.tree.tail(session_uid)[-1].content == "re: first"
