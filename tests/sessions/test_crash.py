"""Crash safety with real processes: SIGKILL a writer at random points while it commits
multi-MB states, then check the file as the next process would find it.

After every kill: `PRAGMA integrity_check` is ok, every turn the child reported committed
(reported only after `commit_turn` returned) is there, and no snapshot disagrees with its
transcript (hash, token count, sha256, and the bytes are exactly the state for that stream).
The rounds place their kills by what the writer has reported, not by the clock, so the
counts asserted at the end hold on a slow or loaded machine too.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import select
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from sessions import SessionStore, chain_hash

from .conftest import FINGERPRINT, fake_state, meta, tokens_of

ctx = mp.get_context("fork")  # fork: no interpreter start per kill, so hundreds fit in a test


def _writer(db_path: str, uid: str, fd: int, seed: int, sizes: tuple[int, int]) -> None:
    rng = random.Random(seed)
    store = SessionStore.open(db_path)
    store.leases.acquire(uid)
    while True:
        text = f"message {rng.random()}"
        store.turns.begin_turn(uid, role="user", content=text, token_ids=tokens_of(text))
        a = store.turns.begin_turn(uid, role="assistant")
        reply = "reply " * rng.randint(1, 50)
        store.turns.update_streaming(a.id, reply[:10])
        ids = tokens_of(reply)
        h = chain_hash(store.tree.get_turn(a.parent_id).stream_hash, ids)
        os.write(fd, f"B {a.id}\n".encode())
        t = store.turns.commit_turn(a.id, content=reply, token_ids=ids, state=fake_state(h, rng.randint(*sizes)),
                              state_meta=meta())
        os.write(fd, f"C {t.id} {t.stream_hash} {t.tokens_total}\n".encode())


def _check_after_crash(db_path: Path, uid: str, committed: dict[int, tuple[str, int]]) -> None:
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    raw.close()
    with SessionStore.open(db_path, readonly=True) as store:
        for turn_id, (stream_hash, total) in committed.items():
            t = store.tree.get_turn(turn_id)
            assert (t.status, t.stream_hash, t.tokens_total) == ("complete", stream_hash, total)
        rows = store.db.execute(
            "SELECT s.turn_id, s.stream_hash, s.n_tokens, s.sha256, s.byte_size, d.data, t.stream_hash,"
            " t.tokens_total, t.status FROM state_snapshots s JOIN snapshot_data d ON d.snapshot_id = s.id"
            " JOIN turns t ON t.id = s.turn_id").fetchall()
        for turn_id, s_hash, s_n, sha, size, data, t_hash, t_total, status in rows:
            assert status != "streaming", f"snapshot on streaming turn {turn_id}"
            assert (s_hash, s_n) == (t_hash, t_total), f"snapshot of turn {turn_id} disagrees with it"
            assert len(data) == size and hashlib.sha256(data).hexdigest() == sha
            assert data == fake_state(t_hash, size)
        if committed:
            newest = max(committed)
            snap = store.states.latest(uid)
            assert snap is not None and snap.turn_id >= newest
            store.states.load(snap, expected_fingerprint=FINGERPRINT)


# Where a kill lands, by round: after the writer reported a commit (so every such round
# adds one committed turn, on any machine), right after it reported beginning one (so the
# kill lands inside the commit unless the commit outruns a read and a kill syscall), and
# at a random moment from the start (opening the store, taking the lease, mid-turn).
ROUNDS = ("after_commit", "in_commit", "anywhere")
WAIT_S = 60.0  # how long a writer may take to report; only a hung writer reaches it


class _Reports:
    """A child's report lines ("B id", "C id hash total"), read from its pipe as they come."""

    def __init__(self, fd: int) -> None:
        self.fd, self.lines, self._rest = fd, [], b""

    def _read(self, timeout: float) -> bool:
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            return False
        *done, self._rest = (self._rest + chunk).split(b"\n")
        self.lines += [line.decode() for line in done]
        return True

    def wait_for(self, prefix: str, timeout_s: float = WAIT_S) -> None:
        """Block until the child has reported a line starting with `prefix`."""
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith(prefix) for line in self.lines):
            left = deadline - time.monotonic()
            assert left > 0 and self._read(left), f"the writer never reported {prefix.strip()!r}"

    def drain(self) -> list[str]:
        while self._read(WAIT_S):
            pass
        os.close(self.fd)
        return self.lines


def run_kills(db_path: Path, kills: int, sizes: tuple[int, int], max_delay_s: float, seed: int = 7) -> dict:
    rng = random.Random(seed)
    with SessionStore.open(db_path) as store:
        uid = store.turns.create_session(model_id="tiny", system_token_ids=tokens_of("sys"), keep_snapshots=1).uid
    committed: dict[int, tuple[str, int]] = {}
    in_commit = 0
    for k in range(kills):
        kind = ROUNDS[k % len(ROUNDS)]
        r, w = os.pipe()
        child = ctx.Process(target=_writer, args=(str(db_path), uid, w, rng.randrange(1 << 30), sizes))
        child.start()
        os.close(w)
        reports = _Reports(r)
        if kind == "after_commit":
            reports.wait_for("C ")
            time.sleep(rng.uniform(0, max_delay_s))
        elif kind == "in_commit":
            reports.wait_for("B ")
        else:
            time.sleep(rng.uniform(0, max_delay_s))
        os.kill(child.pid, signal.SIGKILL)
        child.join(WAIT_S)
        assert child.exitcode == -signal.SIGKILL, f"child ended on its own ({child.exitcode}) at kill {k}"
        lines = reports.drain()
        for line in lines:
            if line.startswith("C "):
                _, tid, h, n = line.split()
                committed[int(tid)] = (h, int(n))
        in_commit += bool(lines) and lines[-1].startswith("B ")
        _check_after_crash(db_path, uid, committed)
    with SessionStore.open(db_path) as store:  # a writer after all of it resumes cleanly
        with store.leases.acquire(uid):
            head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
            assert store.states.verify_branch(uid) == head.depth + 1  # the whole chain recomputes
            assert store.states.resume(uid, expected_fingerprint=FINGERPRINT).state is not None
    return {"kills": kills, "killed_inside_commit": in_commit, "turns_committed": len(committed),
            "rounds_after_commit": len(range(0, kills, len(ROUNDS)))}


def test_sigkill_during_commits_never_loses_or_mismatches(db_path: Path) -> None:
    stats = run_kills(db_path, kills=250, sizes=(1_000_000, 4_000_000), max_delay_s=0.12)
    print("crash test:", stats)
    # The safety checks ran after every kill, whatever the count; these are the floors any
    # machine reaches however loaded: one commit per round that waited for one, and at
    # least one kill that landed inside a commit.
    assert stats["turns_committed"] >= stats["rounds_after_commit"]
    assert stats["killed_inside_commit"] >= 1


@pytest.mark.slow
def test_sigkill_heavy(db_path: Path) -> None:
    stats = run_kills(db_path, kills=400, sizes=(4_000_000, 29_491_200), max_delay_s=0.4, seed=11)
    print("crash test (slow):", stats)
    assert stats["turns_committed"] >= stats["rounds_after_commit"] and stats["killed_inside_commit"] >= 1
