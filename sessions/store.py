"""`SessionStore`: every SQL statement about sessions lives behind this class.

The class is assembled from four files to keep each readable: this one (opening,
transactions, sessions, turns, paging, fork), `store_state.py` (snapshots, verification,
resume, retention), `store_chain.py` (hash-chain check and repair) and `store_extra.py`
(leases, search, runs, export). The data model is
described in `sessions/migrations.py`.

Writes run in `BEGIN IMMEDIATE` transactions (nested calls join the outer one through
savepoints), so a turn and the state after it land together or not at all. Reads run
outside transactions; WAL means they never wait for a writer.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from sqlite_utils import Database

from .database import open_database, utcnow
from .errors import AmbiguousSessionId, InvalidTurnOperation, SessionError, SessionNotFound, TurnNotFound
from .hashing import GENESIS_HASH, chain_hash_packed, pack_ids, unpack_ids
from ._rows import SESSION_COLS, TURN_COLS, prefixed, to_session, to_turn
from .records import ROLES, Session, StateMeta, Turn
from .store_chain import ChainMixin
from .store_extra import ExtrasMixin
from .store_state import StateMixin

SessionRef = Session | int | str
_PREFIX_RE = re.compile(r"^[0-9a-f]{1,32}$")
DEFAULT_KEEP_SNAPSHOTS = 2


class SessionStore(StateMixin, ChainMixin, ExtrasMixin):
    """Sessions, their turn trees, state snapshots, leases and search, in one SQLite file."""

    def __init__(
        self,
        db: Database,
        *,
        path: Path | None = None,
        readonly: bool = False,
        lease_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.path = path
        self.readonly = readonly
        self.lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._tx_depth = 0
        # Identifies this store's leases; a second store in the same process is another writer.
        self._owner = uuid.uuid4().hex
        self._held: dict[int, Any] = {}

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        readonly: bool = False,
        lease_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> "SessionStore":
        """Open the database at `path`, creating and migrating it unless `readonly`."""
        db = open_database(Path(path), readonly=readonly)
        return cls(db, path=Path(path), readonly=readonly, lease_ttl_s=lease_ttl_s, clock=clock)

    def close(self) -> None:
        for lease in list(self._held.values()):
            lease.release()
        self.db.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one transaction (e.g. a bulk import); nests via savepoints."""
        if self.readonly:
            raise SessionError("the session store was opened read-only; open it for writing")
        conn = self.db.conn
        depth = self._tx_depth
        conn.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT sp{depth}")
        self._tx_depth += 1
        try:
            yield
        except BaseException:
            self._tx_depth -= 1
            if depth == 0:
                conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO sp{depth}")
                conn.execute(f"RELEASE sp{depth}")
            raise
        self._tx_depth -= 1
        conn.execute("COMMIT" if depth == 0 else f"RELEASE sp{depth}")

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.db.execute(sql, list(params)).fetchone()

    # -- sessions -----------------------------------------------------------------------

    def get_session(self, ref: SessionRef) -> Session:
        """A session by record, integer id, or unique prefix of its uid."""
        if isinstance(ref, Session):
            ref = ref.id
        if isinstance(ref, int):
            row = self._one(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", [ref])
            if row is None:
                raise SessionNotFound(ref)
            return to_session(row)
        prefix = ref.strip().lower()
        if not _PREFIX_RE.match(prefix):
            raise SessionNotFound(ref)
        # GLOB with a literal prefix uses the uid index; the prefix is hex so needs no escaping.
        rows = self.db.execute(
            f"SELECT {SESSION_COLS} FROM sessions WHERE uid GLOB ? ORDER BY uid LIMIT 11",
            [prefix + "*"],
        ).fetchall()
        if not rows:
            raise SessionNotFound(ref)
        if len(rows) > 1:
            raise AmbiguousSessionId(ref, [r[1] for r in rows])
        return to_session(rows[0])

    def most_recent_session(self, *, include_archived: bool = False) -> Session | None:
        where = "" if include_archived else "WHERE archived = 0"
        row = self._one(f"SELECT {SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC LIMIT 1")
        return to_session(row) if row else None

    def create_session(
        self,
        *,
        model_id: str,
        system_prompt: str = "",
        system_token_ids: Sequence[int] = (),
        name: str | None = None,
        options: dict[str, Any] | None = None,
        keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS,
        state: bytes | None = None,
        state_meta: StateMeta | None = None,
    ) -> Session:
        """A new session whose root turn is the templated system prompt (and its state, if given)."""
        now = utcnow()
        packed = pack_ids(system_token_ids)
        with self.transaction():
            sid = self.db.execute(
                "INSERT INTO sessions (uid, name, model_id, system_prompt, options, keep_snapshots,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [uuid.uuid4().hex, name, model_id, system_prompt, json.dumps(options or {}),
                 keep_snapshots, now, now],
            ).lastrowid
            root = self._insert_turn(sid, None, role="system", content=system_prompt,
                                     status="complete", packed=packed)
            self.db.execute("UPDATE sessions SET head_turn_id = ? WHERE id = ?", [root, sid])
            if state is not None:
                self._store_snapshot(self._turn_row(root), state, state_meta)
        return self.get_session(sid)

    def rename_session(self, ref: SessionRef, name: str | None) -> Session:
        return self._update_session(ref, "name = ?", [name])

    def set_archived(self, ref: SessionRef, archived: bool = True) -> Session:
        return self._update_session(ref, "archived = ?", [int(archived)])

    def set_options(self, ref: SessionRef, options: dict[str, Any]) -> Session:
        return self._update_session(ref, "options = ?", [json.dumps(options)])

    def _update_session(self, ref: SessionRef, assignment: str, params: list[Any]) -> Session:
        s = self.get_session(ref)
        with self.transaction():
            self._guard_lease(s.id)
            self.db.execute(
                f"UPDATE sessions SET {assignment}, updated_at = ? WHERE id = ?", [*params, utcnow(), s.id]
            )
        return self.get_session(s.id)

    # -- turns --------------------------------------------------------------------------

    def _turn_row(self, turn_id: int) -> Turn:
        row = self._one(f"SELECT {TURN_COLS} FROM turns WHERE id = ?", [turn_id])
        if row is None:
            raise TurnNotFound(turn_id)
        return to_turn(row)

    def get_turn(self, turn_id: int) -> Turn:
        return self._turn_row(turn_id)

    def turn_token_ids(self, turn_id: int) -> list[int]:
        row = self._one("SELECT token_ids FROM turns WHERE id = ?", [turn_id])
        if row is None:
            raise TurnNotFound(turn_id)
        return unpack_ids(row[0])

    def _insert_turn(
        self, session_id: int, parent: Turn | None, *, role: str, content: str, status: str, packed: bytes
    ) -> int:
        now = utcnow()
        n = len(packed) // 4
        prev_hash = parent.stream_hash if parent else GENESIS_HASH
        return self.db.execute(
            "INSERT INTO turns (session_id, parent_id, depth, role, content, status, token_ids,"
            " n_tokens, tokens_total, stream_hash, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [session_id, parent.id if parent else None, parent.depth + 1 if parent else 0, role,
             content, status, packed, n, (parent.tokens_total if parent else 0) + n,
             chain_hash_packed(prev_hash, packed), now, now],
        ).lastrowid

    def begin_turn(
        self,
        session: SessionRef,
        *,
        role: str,
        content: str = "",
        token_ids: Sequence[int] | None = None,
        parent_turn_id: int | None = None,
    ) -> Turn:
        """Append a turn under `parent_turn_id` (default: the head) and make it the head.

        User turns are written complete (the message is safe before generation starts);
        assistant and document turns start `streaming` and end with `commit_turn`.
        """
        if role not in ROLES or role == "system":
            raise InvalidTurnOperation(f"cannot begin a turn with role {role!r}; use user, assistant or document")
        s = self.get_session(session)
        status = "complete" if role == "user" else "streaming"
        with self.transaction():
            self._guard_lease(s.id)
            parent = self._turn_row(parent_turn_id if parent_turn_id is not None else s.head_turn_id)
            if parent.session_id != s.id:
                raise TurnNotFound(parent.id, s.uid)
            if parent.status == "streaming":
                raise InvalidTurnOperation(
                    f"turn {parent.id} is still streaming; commit it before adding a turn after it"
                )
            tid = self._insert_turn(s.id, parent, role=role, content=content, status=status,
                                    packed=pack_ids(token_ids or ()))
            self._set_head(s.id, tid)
        return self._turn_row(tid)

    def update_streaming(self, turn_id: int, content: str) -> None:
        """Flush the text of a streaming turn so far (its own small transaction)."""
        with self.transaction():
            row = self._one("SELECT session_id FROM turns WHERE id = ? AND status = 'streaming'", [turn_id])
            if row is None:
                raise InvalidTurnOperation(f"turn {turn_id} is not streaming; it was committed or never begun")
            self._guard_lease(row[0])
            self.db.execute("UPDATE turns SET content = ?, updated_at = ? WHERE id = ?",
                            [content, utcnow(), turn_id])

    def commit_turn(
        self,
        turn_id: int,
        *,
        content: str | None = None,
        status: str = "complete",
        token_ids: Sequence[int] | None = None,
        stats: dict[str, Any] | None = None,
        error: str | None = None,
        state: bytes | None = None,
        state_meta: StateMeta | None = None,
    ) -> Turn:
        """Finish a turn, move the head to it, store the state after it and apply retention.

        All in one transaction: a reader sees the finished turn with its state, or neither.
        `token_ids` are the exact ids folded in for this turn (chat-template tokens included).
        """
        if status not in ("complete", "cancelled", "error"):
            raise InvalidTurnOperation(f"a turn is committed as complete, cancelled or error, not {status!r}")
        with self.transaction():
            turn = self._turn_row(turn_id)
            self._guard_lease(turn.session_id)
            sets = ["status = ?", "updated_at = ?"]
            params: list[Any] = [status, utcnow()]
            if content is not None:
                sets.append("content = ?")
                params.append(content)
            if stats is not None:
                sets.append("stats = ?")
                params.append(json.dumps(stats))
            if error is not None:
                sets.append("error = ?")
                params.append(error)
            if token_ids is not None:
                packed = pack_ids(token_ids)
                old = self._one("SELECT token_ids FROM turns WHERE id = ?", [turn_id])[0] or b""
                if packed != old:
                    # Later turns and snapshots chain from this turn's hash; rewriting it
                    # under them would silently invalidate every one of them.
                    if self._one("SELECT 1 FROM turns WHERE parent_id = ? LIMIT 1", [turn_id]) or \
                            self._one("SELECT 1 FROM state_snapshots WHERE turn_id = ? LIMIT 1", [turn_id]):
                        raise InvalidTurnOperation(
                            f"turn {turn_id} already has later turns or a state; edit it instead (a sibling)"
                        )
                    parent = self._turn_row(turn.parent_id) if turn.parent_id else None
                    n = len(packed) // 4
                    sets += ["token_ids = ?", "n_tokens = ?", "tokens_total = ?", "stream_hash = ?"]
                    params += [packed, n, (parent.tokens_total if parent else 0) + n,
                               chain_hash_packed(parent.stream_hash if parent else GENESIS_HASH, packed)]
            self.db.execute(f"UPDATE turns SET {', '.join(sets)} WHERE id = ?", [*params, turn_id])
            self._set_head(turn.session_id, turn_id)
            turn = self._turn_row(turn_id)
            if state is not None:
                self._store_snapshot(turn, state, state_meta)
        return turn

    def _set_head(self, session_id: int, turn_id: int) -> None:
        self.db.execute("UPDATE sessions SET head_turn_id = ?, updated_at = ? WHERE id = ?",
                        [turn_id, utcnow(), session_id])

    def edit_turn(self, turn_id: int, *, content: str, token_ids: Sequence[int] | None = None) -> Turn:
        """A sibling of `turn_id` with new content; it becomes the head (history is kept)."""
        turn = self._turn_row(turn_id)
        if turn.parent_id is None:
            raise InvalidTurnOperation("the system turn cannot be edited; fork the session with a new system prompt")
        return self.begin_turn(turn.session_id, role=turn.role, content=content, token_ids=token_ids,
                               parent_turn_id=turn.parent_id)

    def regenerate(self, turn_id: int) -> Turn:
        """A new streaming sibling of an assistant turn, to be filled and committed."""
        turn = self._turn_row(turn_id)
        if turn.role != "assistant":
            raise InvalidTurnOperation(f"only assistant turns can be regenerated; turn {turn_id} is {turn.role}")
        return self.begin_turn(turn.session_id, role="assistant", parent_turn_id=turn.parent_id)

    def siblings(self, turn_id: int) -> list[Turn]:
        """The turn and its siblings (same parent), oldest first, for a UI's "< 2/3 >" switch."""
        turn = self._turn_row(turn_id)
        if turn.parent_id is None:
            return [turn]
        rows = self.db.execute(f"SELECT {TURN_COLS} FROM turns WHERE parent_id = ? ORDER BY id",
                               [turn.parent_id]).fetchall()
        return [to_turn(r) for r in rows]

    def set_head(self, session: SessionRef, turn_id: int, *, descend: bool = True) -> Turn:
        """Move the head to `turn_id`, then (if `descend`) down its newest children to a leaf."""
        s = self.get_session(session)
        with self.transaction():
            self._guard_lease(s.id)
            turn = self._turn_row(turn_id)
            if turn.session_id != s.id:
                raise TurnNotFound(turn_id, s.uid)
            while descend:
                row = self._one("SELECT id FROM turns WHERE parent_id = ? ORDER BY id DESC LIMIT 1", [turn.id])
                if row is None:
                    break
                turn = self._turn_row(row[0])
            self._set_head(s.id, turn.id)
        return turn

    # -- paging along the branch ----------------------------------------------------------

    def _walk_up(self, turn_id: int, limit: int | None) -> list[Turn]:
        """`turn_id` and its ancestors, nearest first; O(limit) indexed lookups."""
        cap = -1 if limit is None else limit
        rows = self.db.execute(
            f"""WITH RECURSIVE up(id, n) AS (
                    SELECT ?, 1
                    UNION ALL
                    SELECT t.parent_id, up.n + 1 FROM up JOIN turns t ON t.id = up.id
                    WHERE t.parent_id IS NOT NULL AND (? < 0 OR up.n < ?)
                )
                SELECT {prefixed(TURN_COLS, 't')} FROM up JOIN turns t ON t.id = up.id ORDER BY up.n""",
            [turn_id, cap, cap],
        ).fetchall()
        return [to_turn(r) for r in rows]

    def tail(self, session: SessionRef, limit: int = 50) -> list[Turn]:
        """The last `limit` turns of the current branch, oldest first (root included if reached)."""
        s = self.get_session(session)
        return list(reversed(self._walk_up(s.head_turn_id, limit)))

    def page_before(self, session: SessionRef, turn_id: int, limit: int = 50) -> list[Turn]:
        """Up to `limit` turns before `turn_id` on its branch, oldest first."""
        s = self.get_session(session)
        turn = self._turn_row(turn_id)
        if turn.session_id != s.id:
            raise TurnNotFound(turn_id, s.uid)
        if turn.parent_id is None or limit <= 0:
            return []
        return list(reversed(self._walk_up(turn.parent_id, limit)))

    def branch(self, session: SessionRef, turn_id: int | None = None) -> list[Turn]:
        """The whole branch ending at `turn_id` (default: head), root first. O(history)."""
        s = self.get_session(session)
        return list(reversed(self._walk_up(turn_id if turn_id is not None else s.head_turn_id, None)))

    def branch_token_ids(
        self, session: SessionRef, turn_id: int | None = None, *, after_turn_id: int | None = None
    ) -> Iterator[list[int]]:
        """Per-turn token ids along the branch, oldest first, for replaying it into a state.

        Starts after `after_turn_id` (e.g. the turn of the newest snapshot) when given. Blobs
        are read one turn at a time so a replay streams with progress and flat memory.
        """
        path = self.branch(session, turn_id)
        if after_turn_id is not None:
            ids = [t.id for t in path]
            if after_turn_id not in ids:
                raise InvalidTurnOperation(f"turn {after_turn_id} is not on this branch")
            path = path[ids.index(after_turn_id) + 1:]
        for t in path:
            yield self.turn_token_ids(t.id)
