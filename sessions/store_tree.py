"""The read side of `SessionStore`'s turn trees: single turns, paging along a branch and
replaying a branch's token ids. Nothing here writes or looks at leases."""

from __future__ import annotations

from typing import Iterable, Iterator

from .errors import InvalidTurnOperation, TurnNotFound
from .hashing import unpack_ids
from ._rows import TURN_COLS, prefixed, to_turn
from .records import Turn
from .store_core import SessionRef, StoreCore

_BATCH = 500  # ids per IN (...) query: under SQLite's oldest limit of 999 parameters


class Tree:
    """Reads of turns and branches."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    def get_turn(self, turn_id: int) -> Turn:
        row = self.core.one(f"SELECT {TURN_COLS} FROM turns WHERE id = ?", [turn_id])
        if row is None:
            raise TurnNotFound(turn_id)
        return to_turn(row)

    def turn_token_ids(self, turn_id: int) -> list[int]:
        row = self.core.one("SELECT token_ids FROM turns WHERE id = ?", [turn_id])
        if row is None:
            raise TurnNotFound(turn_id)
        self.core.count_ids(turn_id, row[0])
        return unpack_ids(row[0])

    def spans(self, session: SessionRef, turn_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """The token span [start, stop) of each of these turns in its branch's stream, by id;
        ids that name no turn of `session` are left out. A few indexed reads, for the marks
        a UI shows per turn."""
        s = self.core.get_session(session)
        ids = list(dict.fromkeys(turn_ids))
        out: dict[int, tuple[int, int]] = {}
        for i in range(0, len(ids), _BATCH):
            part = ids[i:i + _BATCH]
            rows = self.core.db.execute(
                "SELECT id, tokens_total - n_tokens, tokens_total FROM turns"
                f" WHERE session_id = ? AND id IN ({','.join('?' * len(part))})", [s.id, *part]).fetchall()
            out.update({row[0]: (row[1], row[2]) for row in rows})
        return out

    def siblings(self, turn_id: int) -> list[Turn]:
        """The turn and its siblings (same parent), oldest first, for a UI's "< 2/3 >" switch."""
        turn = self.get_turn(turn_id)
        if turn.parent_id is None:
            return [turn]
        rows = self.core.db.execute(f"SELECT {TURN_COLS} FROM turns WHERE parent_id = ? ORDER BY id",
                                    [turn.parent_id]).fetchall()
        return [to_turn(r) for r in rows]

    def _walk_up(self, turn_id: int, limit: int | None) -> list[Turn]:
        """`turn_id` and its ancestors, nearest first; O(limit) indexed lookups."""
        cap = -1 if limit is None else limit
        rows = self.core.db.execute(
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
        s = self.core.get_session(session)
        return list(reversed(self._walk_up(s.head_turn_id, limit)))

    def page_before(self, session: SessionRef, turn_id: int, limit: int = 50) -> list[Turn]:
        """Up to `limit` turns before `turn_id` on its branch, oldest first."""
        s = self.core.get_session(session)
        turn = self.get_turn(turn_id)
        if turn.session_id != s.id:
            raise TurnNotFound(turn_id, s.uid)
        if turn.parent_id is None or limit <= 0:
            return []
        return list(reversed(self._walk_up(turn.parent_id, limit)))

    def branch(self, session: SessionRef, turn_id: int | None = None) -> list[Turn]:
        """The whole branch ending at `turn_id` (default: head), root first. O(history)."""
        s = self.core.get_session(session)
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
