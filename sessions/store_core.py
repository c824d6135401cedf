"""The part every other `SessionStore` part shares: the connection, transactions and
session lookup.

Writes run in `BEGIN IMMEDIATE` transactions (nested calls join the outer one through
savepoints), so a turn and the state after it land together or not at all. Reads run
outside transactions; WAL means they never wait for a writer.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from sqlite_utils import Database

from .errors import AmbiguousSessionId, DamagedTokenIds, SessionError, SessionNotFound
from .hashing import count_ids
from ._rows import SESSION_COLS, to_session
from .records import Session

SessionRef = Session | int | str
_PREFIX_RE = re.compile(r"^[0-9a-f]{1,32}$")


class StoreCore:
    """The open database: transactions, one-row reads and looking a session up."""

    def __init__(self, db: Database, *, path: Path | None, readonly: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.path = path
        self.readonly = readonly
        self.clock = clock
        self._tx_depth = 0

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

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first row of a query, or None."""
        return self.db.execute(sql, list(params)).fetchone()

    def get_session(self, ref: SessionRef) -> Session:
        """A session by record, integer id, or unique prefix of its uid."""
        if isinstance(ref, Session):
            ref = ref.id
        if isinstance(ref, int):
            row = self.one(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?", [ref])
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

    def session_uid(self, session_id: int) -> str:
        return self.one("SELECT uid FROM sessions WHERE id = ?", [session_id])[0]

    def count_ids(self, turn_id: int, blob: object) -> int:
        """The number of ids in turn `turn_id`'s stored blob; DamagedTokenIds (naming the turn
        and the fork that keeps the part before it) when the blob is not whole int32s. Every
        reader of token ids calls this before it hashes, unpacks or writes anything."""
        n = count_ids(blob)
        if n is None:
            uid, parent = self.one("SELECT s.uid, t.parent_id FROM turns t JOIN sessions s ON s.id = t.session_id"
                                   " WHERE t.id = ?", [turn_id])
            size = f"{len(blob)} bytes" if isinstance(blob, bytes) else f"a {type(blob).__name__} value"
            raise DamagedTokenIds(uid, turn_id, parent, size)
        return n
