"""The snapshot part of `SessionStore`: storing, retaining, verifying and resuming states.

A snapshot is a cache of "the model after reading exactly the branch up to this turn". It
is trusted only after three checks: sha256 of the bytes (corruption), the model
fingerprint (wrong model) and the token stream (wrong transcript). The first two need the
bytes; the third compares two stored values, so resume stays O(1) in the history length.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from .database import utcnow
from .errors import StateChecksumError, StateModelMismatch, StateTranscriptMismatch, TurnNotFound
from .hashing import GENESIS_HASH, chain_hash_packed
from ._rows import SNAPSHOT_COLS, to_snapshot
from .records import Resumed, Snapshot, StateMeta, Turn
from .store_core import SessionRef, StoreCore
from .store_leases import Leases
from .store_tree import Tree


class Snapshots:
    """State snapshots of turns."""

    def __init__(self, core: StoreCore, leases: Leases, tree: Tree) -> None:
        self.core = core
        self.leases = leases
        self.tree = tree

    def store(self, turn: Turn, state: bytes, meta: StateMeta | None) -> Snapshot:
        """Insert a snapshot for `turn` and apply retention; the caller holds the transaction."""
        if meta is None:
            raise ValueError("a state needs its StateMeta (at least the model fingerprint)")
        if turn.status == "streaming":
            # A streaming row's text and tokens are still moving; a state for it could not match.
            raise StateTranscriptMismatch(self.core.session_uid(turn.session_id), turn.id, "the turn is still streaming")
        if meta.n_tokens is not None and meta.n_tokens != turn.tokens_total:
            raise StateTranscriptMismatch(
                self.core.session_uid(turn.session_id), turn.id,
                f"state folded {meta.n_tokens} tokens, transcript has {turn.tokens_total}",
            )
        if meta.stream_hash is not None and meta.stream_hash != turn.stream_hash:
            raise StateTranscriptMismatch(
                self.core.session_uid(turn.session_id), turn.id, "token-stream hash differs")
        blob = bytes(state)
        sid = self.core.db.execute(
            "INSERT INTO state_snapshots (uid, session_id, turn_id, n_tokens, stream_hash,"
            " model_fingerprint, format, dtype, byte_size, sha256, extra, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [uuid.uuid4().hex, turn.session_id, turn.id, turn.tokens_total, turn.stream_hash,
             meta.model_fingerprint, meta.format, meta.dtype, len(blob),
             hashlib.sha256(blob).hexdigest(), json.dumps(meta.extra), utcnow()],
        ).lastrowid
        self.core.db.execute("INSERT INTO snapshot_data (snapshot_id, data) VALUES (?, ?)", [sid, blob])
        self._apply_retention(turn)
        return self.get(sid)

    def put(self, turn_id: int, state: bytes, meta: StateMeta) -> Snapshot:
        """Store a state for an existing turn, e.g. one rebuilt by replaying the transcript."""
        with self.core.transaction():
            turn = self.tree.get_turn(turn_id)
            self.leases.guard(turn.session_id)
            return self.store(turn, state, meta)

    def _ancestor_ids(self, turn_id: int, floor_depth: int) -> set[int]:
        rows = self.core.db.execute(
            """WITH RECURSIVE up(id, parent_id, depth) AS (
                   SELECT id, parent_id, depth FROM turns WHERE id = ?
                   UNION ALL
                   SELECT t.id, t.parent_id, t.depth FROM up JOIN turns t ON t.id = up.parent_id
                   WHERE up.depth > ?
               ) SELECT id FROM up""",
            [turn_id, floor_depth],
        ).fetchall()
        return {r[0] for r in rows}

    def _snapshots_on_branch(self, turn: Turn) -> list[Snapshot]:
        """Snapshots on the path root..turn, newest (deepest) first.

        Only snapshots no deeper than `turn` can be on its path, and retention keeps few
        per branch, so the walk usually stops within a few steps of `turn`.
        """
        rows = self.core.db.execute(
            f"SELECT {SNAPSHOT_COLS} FROM state_snapshots s JOIN turns t ON t.id = s.turn_id"
            " WHERE s.session_id = ? AND t.depth <= ? ORDER BY t.depth DESC, s.id DESC",
            [turn.session_id, turn.depth],
        ).fetchall()
        candidates = [to_snapshot(r) for r in rows]
        if not candidates:
            return []
        on_path = self._ancestor_ids(turn.id, min(c.depth for c in candidates))
        return [c for c in candidates if c.turn_id in on_path]

    def _apply_retention(self, turn: Turn) -> None:
        """Keep the newest snapshot on this branch plus `keep_snapshots` older ones.

        Snapshots on other branches are not on this path and stay: each branch keeps its
        latest, pruned when that branch is committed to.
        """
        keep = self.core.one("SELECT keep_snapshots FROM sessions WHERE id = ?", [turn.session_id])[0]
        doomed = [s.id for s in self._snapshots_on_branch(turn)[keep + 1:]]
        if doomed:
            marks = ",".join("?" * len(doomed))
            self.core.db.execute(f"DELETE FROM state_snapshots WHERE id IN ({marks})", doomed)

    def set_keep(self, session: SessionRef, keep: int) -> None:
        """Change how many older snapshots each branch keeps; prunes the current branch now."""
        if keep < 0:
            raise ValueError("keep_snapshots must be >= 0")
        s = self.core.get_session(session)
        with self.core.transaction():
            self.leases.guard(s.id)
            self.core.db.execute("UPDATE sessions SET keep_snapshots = ? WHERE id = ?", [keep, s.id])
            self._apply_retention(self.tree.get_turn(s.head_turn_id))

    def get(self, snapshot_id: int) -> Snapshot:
        row = self.core.one(f"SELECT {SNAPSHOT_COLS} FROM state_snapshots s JOIN turns t ON t.id = s.turn_id"
                        " WHERE s.id = ?", [snapshot_id])
        if row is None:
            raise LookupError(f"no snapshot {snapshot_id}")
        return to_snapshot(row)

    def all(self, session: SessionRef) -> list[Snapshot]:
        """Every snapshot of a session (all branches), deepest first; metadata only."""
        s = self.core.get_session(session)
        rows = self.core.db.execute(
            f"SELECT {SNAPSHOT_COLS} FROM state_snapshots s JOIN turns t ON t.id = s.turn_id"
            " WHERE s.session_id = ? ORDER BY t.depth DESC, s.id DESC", [s.id]).fetchall()
        return [to_snapshot(r) for r in rows]

    def latest(self, session: SessionRef, turn_id: int | None = None) -> Snapshot | None:
        """The newest snapshot on the branch ending at `turn_id` (default: head)."""
        s = self.core.get_session(session)
        turn = self.tree.get_turn(turn_id if turn_id is not None else s.head_turn_id)
        if turn.session_id != s.id:
            raise TurnNotFound(turn.id, s.uid)
        found = self._snapshots_on_branch(turn)
        return found[0] if found else None

    def load(self, snapshot: Snapshot | int, *, expected_fingerprint: str | None) -> bytes:
        """The snapshot's bytes after checking checksum, model and transcript.

        `expected_fingerprint=None` skips only the model check (for tools with no model).
        """
        snap = snapshot if isinstance(snapshot, Snapshot) else self.get(snapshot)
        uid = self.core.session_uid(snap.session_id)
        row = self.core.one("SELECT data FROM snapshot_data WHERE snapshot_id = ?", [snap.id])
        if row is None:
            raise StateChecksumError(uid, snap.turn_id, "state bytes missing")
        data: bytes = row[0]
        if len(data) != snap.byte_size:
            raise StateChecksumError(uid, snap.turn_id, f"{len(data)} bytes stored, {snap.byte_size} expected")
        if hashlib.sha256(data).hexdigest() != snap.sha256:
            raise StateChecksumError(uid, snap.turn_id)
        if expected_fingerprint is not None and snap.model_fingerprint != expected_fingerprint:
            raise StateModelMismatch(uid, snap.turn_id, snap.model_fingerprint, expected_fingerprint)
        turn = self.tree.get_turn(snap.turn_id)
        if snap.stream_hash != turn.stream_hash:
            raise StateTranscriptMismatch(uid, snap.turn_id, "token-stream hash differs")
        if snap.n_tokens != turn.tokens_total:
            raise StateTranscriptMismatch(
                uid, snap.turn_id, f"state folded {snap.n_tokens} tokens, transcript has {turn.tokens_total}")
        return data

    def resume(
        self,
        session: SessionRef,
        *,
        tail: int = 50,
        expected_fingerprint: str | None = None,
        load: bool = True,
    ) -> Resumed:
        """Head, transcript tail and the newest verified state on the branch.

        Costs O(tail + state size), not O(history): the tail is `tail` parent hops and the
        snapshot check compares stored hashes. Raises a `StateError` when the state cannot
        be trusted; the caller then replays `branch_token_ids` and calls `put_snapshot`.
        """
        s = self.core.get_session(session)
        turns = self.tree.tail(s.id, tail)
        head = turns[-1]
        snap = self.latest(s.id, head.id)
        state = self.load(snap, expected_fingerprint=expected_fingerprint) if snap and load else None
        return Resumed(session=s, head=head, turns=turns, has_older=turns[0].parent_id is not None,
                       snapshot=snap, state=state)

    def verify_branch(self, session: SessionRef, turn_id: int | None = None) -> int:
        """Deep check, O(history): recompute the hash chain from the token blobs along the
        branch and compare every turn and snapshot on it. Returns the number of turns checked.
        """
        s = self.core.get_session(session)
        path = self.tree.branch(s.id, turn_id)
        snaps: dict[int, list[Snapshot]] = {}
        for snap in self._snapshots_on_branch(path[-1]):
            snaps.setdefault(snap.turn_id, []).append(snap)
        prev, total = GENESIS_HASH, 0
        for t in path:
            blob = self.core.one("SELECT token_ids FROM turns WHERE id = ?", [t.id])[0]
            n = self.core.count_ids(t.id, blob)  # before hashing: the blob must be whole ids
            prev, total = chain_hash_packed(prev, blob), total + n
            if prev != t.stream_hash or total != t.tokens_total:
                raise StateTranscriptMismatch(s.uid, t.id, "stored token-stream hash or count differs from the token ids")
            for snap in snaps.get(t.id, []):
                if snap.stream_hash != prev or snap.n_tokens != total:
                    raise StateTranscriptMismatch(s.uid, t.id, "snapshot does not match the recomputed token stream")
                self.load(snap, expected_fingerprint=None)
        return len(path)
