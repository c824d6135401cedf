"""The browsing part of `SessionStore`: listing, fork, delete, full-text search, probe and
finetune run records, and export."""

from __future__ import annotations

import json
import uuid
from typing import Any

from . import export as _export
from .database import utcnow
from .errors import TurnNotFound
from ._rows import RUN_COLS, SESSION_COLS, TURN_COLS, prefixed, to_run, to_session, to_turn
from .records import RunRecord, SearchHit, Session, SessionSummary, Turn
from .store_core import SessionRef, StoreCore
from .store_leases import Leases
from .store_state import Snapshots
from .store_tree import Tree


class Browse:
    """Whole-session operations and queries across sessions."""

    def __init__(self, core: StoreCore, leases: Leases, tree: Tree, snapshots: Snapshots) -> None:
        self.core = core
        self.leases = leases
        self.tree = tree
        self.snapshots = snapshots

    def most_recent_session(self, *, include_archived: bool = False) -> Session | None:
        where = "" if include_archived else "WHERE archived = 0"
        row = self.core.one(f"SELECT {SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC LIMIT 1")
        return to_session(row) if row else None

    # -- listing, fork, delete ------------------------------------------------------------

    def list_sessions(self, *, include_archived: bool = False, limit: int | None = None) -> list[SessionSummary]:
        """Sessions, most recently used first, with O(1)-per-session figures."""
        where = "" if include_archived else "WHERE s.archived = 0"
        rows = self.core.db.execute(
            f"""SELECT {prefixed(SESSION_COLS, 's')}, h.depth, h.tokens_total,
                   (SELECT byte_size FROM state_snapshots WHERE session_id = s.id ORDER BY id DESC LIMIT 1),
                   (SELECT count(*) FROM state_snapshots WHERE session_id = s.id)
                FROM sessions s LEFT JOIN turns h ON h.id = s.head_turn_id {where}
                ORDER BY s.updated_at DESC LIMIT ?""",
            [-1 if limit is None else limit],
        ).fetchall()
        return [SessionSummary(session=to_session(r[:13]), turns=r[13] or 0, tokens_folded=r[14] or 0,
                               state_bytes=r[15] or 0, snapshots=r[16]) for r in rows]

    def summary(self, session: SessionRef) -> SessionSummary:
        s = self.core.get_session(session)
        for item in self.list_sessions(include_archived=True):
            if item.session.id == s.id:
                return item
        raise AssertionError("unreachable: session vanished between reads")

    def fork(self, session: SessionRef, turn_id: int | None = None, *, name: str | None = None) -> Session:
        """A new session holding a copy of the branch up to `turn_id` (default: head).

        Turn rows on the path are copied (O(branch)); only the newest state on the path is
        copied, and inside SQLite (`INSERT ... SELECT`), so the bytes never pass through Python.
        """
        s = self.core.get_session(session)
        path = self.tree.branch(s.id, turn_id)
        if path[-1].session_id != s.id:
            raise TurnNotFound(path[-1].id, s.uid)
        now = utcnow()
        with self.core.transaction():
            new_id = self.core.db.execute(
                "INSERT INTO sessions (uid, name, model_id, system_prompt, options, keep_snapshots,"
                " forked_from_session_id, forked_from_turn_id, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [uuid.uuid4().hex, name or f"{s.name or s.short_id} (fork)", s.model_id, s.system_prompt,
                 json.dumps(s.options), s.keep_snapshots, s.id, path[-1].id, now, now],
            ).lastrowid
            mapping: dict[int, int] = {}
            for t in path:
                mapping[t.id] = self.core.db.execute(
                    "INSERT INTO turns (session_id, parent_id, depth, role, content, status, token_ids,"
                    " n_tokens, tokens_total, stream_hash, stats, error, created_at, updated_at)"
                    " SELECT ?, ?, depth, role, content,"
                    " CASE status WHEN 'streaming' THEN 'cancelled' ELSE status END, token_ids,"
                    " n_tokens, tokens_total, stream_hash, stats, error, created_at, updated_at"
                    " FROM turns WHERE id = ?",
                    [new_id, mapping.get(t.parent_id), t.id],
                ).lastrowid
            snap = self.snapshots.latest(s.id, path[-1].id)
            if snap is not None:
                copy = self.core.db.execute(
                    "INSERT INTO state_snapshots (uid, session_id, turn_id, n_tokens, stream_hash,"
                    " model_fingerprint, format, dtype, byte_size, sha256, extra, created_at)"
                    " SELECT ?, ?, ?, n_tokens, stream_hash, model_fingerprint, format, dtype, byte_size,"
                    " sha256, extra, ? FROM state_snapshots WHERE id = ?",
                    [uuid.uuid4().hex, new_id, mapping[snap.turn_id], now, snap.id],
                ).lastrowid
                self.core.db.execute("INSERT INTO snapshot_data (snapshot_id, data)"
                                " SELECT ?, data FROM snapshot_data WHERE snapshot_id = ?", [copy, snap.id])
            self.core.db.execute("UPDATE sessions SET head_turn_id = ? WHERE id = ?", [mapping[path[-1].id], new_id])
        return self.core.get_session(new_id)

    def delete_session(self, session: SessionRef) -> None:
        """Delete a session, its turns and snapshots, and scrub the text from the files.

        secure_delete zeroes the freed pages; the FTS index is merged so no deleted term
        stays in it; a TRUNCATE checkpoint empties the WAL that still holds old pages.
        """
        s = self.core.get_session(session)
        # Full secure_delete only here: FAST (the default we run with) leaves freed overflow
        # pages, i.e. long texts and state BLOBs, unzeroed, which is fine for retention but
        # not for a user's explicit delete.
        self.core.db.execute("PRAGMA secure_delete = ON")
        try:
            with self.core.transaction():
                self.leases.guard(s.id)
                self.core.db.execute("DELETE FROM sessions WHERE id = ?", [s.id])
                self.core.db.execute("INSERT INTO turns_fts(turns_fts) VALUES ('optimize')")
        finally:
            self.core.db.execute("PRAGMA secure_delete = FAST")
        self.core.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    # -- search -------------------------------------------------------------------------

    def search(self, query: str, *, limit: int = 20, include_archived: bool = False) -> list[SearchHit]:
        """Full-text search over turn content; words are matched as plain terms (no FTS syntax)."""
        terms = " ".join('"' + w.replace('"', '""') + '"' for w in query.split())
        if not terms:
            return []
        archived = "" if include_archived else "AND s.archived = 0"
        rows = self.core.db.execute(
            f"""SELECT s.uid, s.name, t.id, t.role,
                       snippet(turns_fts, 0, '«', '»', '…', 12), t.created_at
                FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid JOIN sessions s ON s.id = t.session_id
                WHERE turns_fts MATCH ? {archived} ORDER BY rank LIMIT ?""",
            [terms, limit],
        ).fetchall()
        return [SearchHit(session_uid=r[0], session_name=r[1], turn_id=r[2], role=r[3], snippet=r[4],
                          created_at=r[5]) for r in rows]

    def branch_matches(self, session: SessionRef, words: list[str], *, turn_id: int | None = None,
                       ending_by: int | None = None, limit: int = 50) -> list[Turn]:
        """Turns on the branch ending at `turn_id` (default: head) that contain any of
        `words` (FTS5, best bm25 first), for recall refresh; with `ending_by`, only turns
        that end at or before that token position. Recall blocks themselves (document
        turns whose stats say kind "recall") and streaming turns are left out.

        Cost: the index lookup, then a walk up the branch only as far as the oldest hit."""
        s = self.core.get_session(session)
        terms = " OR ".join('"' + w.replace('"', '""') + '"' for w in words if w.strip())
        if not terms:
            return []
        head = self.tree.get_turn(turn_id if turn_id is not None else s.head_turn_id)
        rows = self.core.db.execute(
            f"""SELECT {prefixed(TURN_COLS, 't')} FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid
                WHERE turns_fts MATCH ? AND t.session_id = ? AND t.status != 'streaming'
                  AND t.depth <= ? AND t.tokens_total <= ?
                  AND coalesce(json_extract(t.stats, '$.kind'), '') != 'recall'
                ORDER BY rank LIMIT ?""",
            [terms, s.id, head.depth, head.tokens_total if ending_by is None else ending_by, limit],
        ).fetchall()
        hits = [to_turn(r) for r in rows]
        if not hits:
            return []
        low = min(h.depth for h in hits)
        on_branch = {r[0] for r in self.core.db.execute(
            """WITH RECURSIVE up(id, depth) AS (
                   SELECT id, depth FROM turns WHERE id = ?
                   UNION ALL
                   SELECT t.parent_id, t.depth - 1 FROM up JOIN turns t ON t.id = up.id
                   WHERE t.parent_id IS NOT NULL AND up.depth > ?
               ) SELECT id FROM up""", [head.id, low]).fetchall()}
        return [h for h in hits if h.id in on_branch]

    # -- probe and finetune runs ----------------------------------------------------------

    def _add_run(self, table: str, model_id: str, kind: str, payload: dict[str, Any],
                 session: SessionRef | None) -> RunRecord:
        sid = self.core.get_session(session).id if session is not None else None
        with self.core.transaction():
            rid = self.core.db.execute(
                f"INSERT INTO {table} (uid, created_at, model_id, kind, payload, session_id)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [uuid.uuid4().hex, utcnow(), model_id, kind, json.dumps(payload), sid]).lastrowid
        return to_run(self.core.one(f"SELECT {RUN_COLS} FROM {table} WHERE id = ?", [rid]))

    def _list_runs(self, table: str, session: SessionRef | None, limit: int) -> list[RunRecord]:
        where, params = ("WHERE session_id = ?", [self.core.get_session(session).id]) if session is not None else ("", [])
        rows = self.core.db.execute(f"SELECT {RUN_COLS} FROM {table} {where} ORDER BY id DESC LIMIT ?",
                               [*params, limit]).fetchall()
        return [to_run(r) for r in rows]

    def add_probe_run(self, *, model_id: str, suite: str, payload: dict[str, Any],
                      session: SessionRef | None = None) -> RunRecord:
        return self._add_run("probe_runs", model_id, suite, payload, session)

    def list_probe_runs(self, *, session: SessionRef | None = None, limit: int = 50) -> list[RunRecord]:
        return self._list_runs("probe_runs", session, limit)

    def add_finetune_run(self, *, model_id: str, kind: str, payload: dict[str, Any],
                         session: SessionRef | None = None) -> RunRecord:
        return self._add_run("finetune_runs", model_id, kind, payload, session)

    def list_finetune_runs(self, *, limit: int = 50) -> list[RunRecord]:
        return self._list_runs("finetune_runs", None, limit)

    # -- export ---------------------------------------------------------------------------

    def export_json(self, session: SessionRef, turn_id: int | None = None) -> dict[str, Any]:
        """The branch as `{"session": {...}, "messages": [{"role", "content", ...}]}`."""
        s = self.core.get_session(session)
        return _export.to_json(s, self.tree.branch(s.id, turn_id))

    def export_markdown(self, session: SessionRef, turn_id: int | None = None) -> str:
        s = self.core.get_session(session)
        return _export.to_markdown(s, self.tree.branch(s.id, turn_id))
