"""The hash-chain part of `SessionStore`: check the token-stream chain against the stored ids,
and repair it after the ids changed underneath it.

Each turn records `stream_hash = chain_hash(parent.stream_hash, token_ids)`. Comparing a
snapshot with its turn's recorded hash (what `load_state` does) is O(1), but it cannot see
an earlier turn whose token ids were edited in place: the recorded hashes stay as they were.
`check_chain` recomputes the chain from the stored ids along a branch (hashing only, no
state bytes and no replay), so resume can afford it; `rechain` rewrites the recorded hashes
and token totals from the ids and drops the snapshots that no longer match, before a
rebuild replays the ids into a fresh state.
"""

from __future__ import annotations

from .errors import StateTranscriptMismatch
from .hashing import GENESIS_HASH, chain_hash_packed, count_ids
from .store_core import SessionRef, StoreCore
from .store_leases import Leases


class Chain:
    """Checking and repairing the recorded token-stream hashes."""

    def __init__(self, core: StoreCore, leases: Leases) -> None:
        self.core = core
        self.leases = leases

    def check_chain(self, session: SessionRef, turn_id: int | None = None) -> int:
        """Recompute the hash chain from the stored token ids along the branch ending at
        `turn_id` (default: head) and compare each turn's recorded hash and token total.

        Raises StateTranscriptMismatch naming the first turn that differs (DamagedTokenIds
        where its ids are not whole int32s); returns the number of tokens on the branch. One
        query; cost is hashing the branch's ids.
        """
        s = self.core.get_session(session)
        rows = self.core.db.execute(
            """WITH RECURSIVE up(id) AS (
                   SELECT ?
                   UNION ALL
                   SELECT t.parent_id FROM up JOIN turns t ON t.id = up.id WHERE t.parent_id IS NOT NULL
               ) SELECT t.id, t.token_ids, t.stream_hash, t.tokens_total, t.session_id
                 FROM up JOIN turns t ON t.id = up.id ORDER BY t.depth""",
            [turn_id if turn_id is not None else s.head_turn_id],
        )
        prev, total = GENESIS_HASH, 0
        for tid, blob, recorded, recorded_total, sid in rows:
            if sid != s.id:
                raise StateTranscriptMismatch(s.uid, tid, "the turn belongs to another session")
            n = self.core.count_ids(tid, blob)  # before hashing: the blob must be whole ids
            prev, total = chain_hash_packed(prev, blob), total + n
            if prev != recorded or total != recorded_total:
                raise StateTranscriptMismatch(
                    s.uid, tid, f"the token ids stored for turn {tid} do not match its recorded hash chain")
        return total

    def rechain(self, session: SessionRef) -> tuple[int, int]:
        """Rewrite every turn's recorded hash and token total from the stored ids, and drop
        the snapshots that no longer match their turn. Returns (turns fixed, snapshots
        dropped); (0, 0) when the chain was intact. O(session): for a rebuild only.

        Damaged ids (not whole int32s) on the head's branch raise DamagedTokenIds before
        anything is written; a damaged turn on another branch and the turns below it are
        left as they are (no replay reads them, and `check_chain` names them there)."""
        s = self.core.get_session(session)
        with self.core.transaction():
            self.leases.guard(s.id)
            rows = self.core.db.execute(
                "SELECT id, parent_id, token_ids, stream_hash, tokens_total FROM turns"
                " WHERE session_id = ? ORDER BY depth, id", [s.id]).fetchall()
            on_branch = {r[0] for r in self.core.db.execute(
                "WITH RECURSIVE up(id) AS (SELECT ? UNION ALL SELECT t.parent_id FROM up JOIN turns t ON t.id = up.id"
                " WHERE t.parent_id IS NOT NULL) SELECT id FROM up", [s.head_turn_id])}
            counts: dict[int, int | None] = {}
            for tid, parent_id, blob, _, _ in rows:
                counts[tid] = self.core.count_ids(tid, blob) if tid in on_branch else count_ids(blob)
            chain: dict[int, tuple[str, int]] = {}
            skipped: set[int] = set()
            fixed = 0
            for tid, parent_id, blob, recorded, recorded_total in rows:
                n = counts[tid]
                if n is None or parent_id in skipped:
                    skipped.add(tid)
                    continue
                prev, base = chain.get(parent_id, (GENESIS_HASH, 0))
                chain[tid] = (chain_hash_packed(prev, blob), base + n)
                if chain[tid] != (recorded, recorded_total):
                    fixed += 1
                    self.core.db.execute("UPDATE turns SET stream_hash = ?, tokens_total = ?, n_tokens = ? WHERE id = ?",
                                    [chain[tid][0], chain[tid][1], n, tid])
            stale = [sid for sid, tid, h, n in self.core.db.execute(
                "SELECT id, turn_id, stream_hash, n_tokens FROM state_snapshots WHERE session_id = ?", [s.id])
                if tid not in skipped and chain.get(tid) != (h, n)]
            if stale:
                self.core.db.execute(f"DELETE FROM state_snapshots WHERE id IN ({','.join('?' * len(stale))})", stale)
        return fixed, len(stale)
