"""The write side of `SessionStore`'s sessions and turn trees: creating and renaming
sessions, appending, streaming, committing and editing turns, and moving the head.

A committed turn and the state after it are written in one transaction (through the
snapshot part), so a reader sees both or neither.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Sequence

from .database import utcnow
from .errors import InvalidTurnOperation, TurnNotFound
from .hashing import GENESIS_HASH, chain_hash_packed, pack_ids
from .records import ROLES, Session, StateMeta, Turn
from .store_core import SessionRef, StoreCore
from .store_leases import Leases
from .store_state import Snapshots
from .store_tree import Tree

DEFAULT_KEEP_SNAPSHOTS = 2


class Turns:
    """Writes to sessions and their turns; every write checks the session's lease."""

    def __init__(self, core: StoreCore, leases: Leases, tree: Tree, snapshots: Snapshots) -> None:
        self.core = core
        self.leases = leases
        self.tree = tree
        self.snapshots = snapshots

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
        with self.core.transaction():
            sid = self.core.db.execute(
                "INSERT INTO sessions (uid, name, model_id, system_prompt, options, keep_snapshots,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [uuid.uuid4().hex, name, model_id, system_prompt, json.dumps(options or {}),
                 keep_snapshots, now, now],
            ).lastrowid
            root = self.insert(sid, None, role="system", content=system_prompt,
                                     status="complete", packed=packed)
            self.core.db.execute("UPDATE sessions SET head_turn_id = ? WHERE id = ?", [root, sid])
            if state is not None:
                self.snapshots.store(self.tree.get_turn(root), state, state_meta)
        return self.core.get_session(sid)

    def rename_session(self, ref: SessionRef, name: str | None) -> Session:
        return self._update(ref, "name = ?", [name])

    def set_archived(self, ref: SessionRef, archived: bool = True) -> Session:
        return self._update(ref, "archived = ?", [int(archived)])

    def set_options(self, ref: SessionRef, options: dict[str, Any]) -> Session:
        return self._update(ref, "options = ?", [json.dumps(options)])

    def _update(self, ref: SessionRef, assignment: str, params: list[Any]) -> Session:
        s = self.core.get_session(ref)
        with self.core.transaction():
            self.leases.guard(s.id)
            self.core.db.execute(
                f"UPDATE sessions SET {assignment}, updated_at = ? WHERE id = ?", [*params, utcnow(), s.id]
            )
        return self.core.get_session(s.id)

    def insert(
        self, session_id: int, parent: Turn | None, *, role: str, content: str, status: str, packed: bytes
    ) -> int:
        now = utcnow()
        n = len(packed) // 4
        prev_hash = parent.stream_hash if parent else GENESIS_HASH
        return self.core.db.execute(
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
        s = self.core.get_session(session)
        status = "complete" if role == "user" else "streaming"
        with self.core.transaction():
            self.leases.guard(s.id)
            parent = self.tree.get_turn(parent_turn_id if parent_turn_id is not None else s.head_turn_id)
            if parent.session_id != s.id:
                raise TurnNotFound(parent.id, s.uid)
            if parent.status == "streaming":
                raise InvalidTurnOperation(
                    f"turn {parent.id} is still streaming; commit it before adding a turn after it"
                )
            tid = self.insert(s.id, parent, role=role, content=content, status=status,
                                    packed=pack_ids(token_ids or ()))
            self._move_head(s.id, tid)
        return self.tree.get_turn(tid)

    def update_streaming(self, turn_id: int, content: str) -> None:
        """Flush the text of a streaming turn so far (its own small transaction)."""
        with self.core.transaction():
            row = self.core.one("SELECT session_id FROM turns WHERE id = ? AND status = 'streaming'", [turn_id])
            if row is None:
                raise InvalidTurnOperation(f"turn {turn_id} is not streaming; it was committed or never begun")
            self.leases.guard(row[0])
            self.core.db.execute("UPDATE turns SET content = ?, updated_at = ? WHERE id = ?",
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
        with self.core.transaction():
            turn = self.tree.get_turn(turn_id)
            self.leases.guard(turn.session_id)
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
                old = self.core.one("SELECT token_ids FROM turns WHERE id = ?", [turn_id])[0] or b""
                if packed != old:
                    # Later turns and snapshots chain from this turn's hash; rewriting it
                    # under them would silently invalidate every one of them.
                    if self.core.one("SELECT 1 FROM turns WHERE parent_id = ? LIMIT 1", [turn_id]) or \
                            self.core.one("SELECT 1 FROM state_snapshots WHERE turn_id = ? LIMIT 1", [turn_id]):
                        raise InvalidTurnOperation(
                            f"turn {turn_id} already has later turns or a state; edit it instead (a sibling)"
                        )
                    parent = self.tree.get_turn(turn.parent_id) if turn.parent_id else None
                    n = len(packed) // 4
                    sets += ["token_ids = ?", "n_tokens = ?", "tokens_total = ?", "stream_hash = ?"]
                    params += [packed, n, (parent.tokens_total if parent else 0) + n,
                               chain_hash_packed(parent.stream_hash if parent else GENESIS_HASH, packed)]
            self.core.db.execute(f"UPDATE turns SET {', '.join(sets)} WHERE id = ?", [*params, turn_id])
            self._move_head(turn.session_id, turn_id)
            turn = self.tree.get_turn(turn_id)
            if state is not None:
                self.snapshots.store(turn, state, state_meta)
        return turn

    def _move_head(self, session_id: int, turn_id: int) -> None:
        self.core.db.execute("UPDATE sessions SET head_turn_id = ?, updated_at = ? WHERE id = ?",
                        [turn_id, utcnow(), session_id])

    def edit_turn(self, turn_id: int, *, content: str, token_ids: Sequence[int] | None = None) -> Turn:
        """A sibling of `turn_id` with new content; it becomes the head (history is kept)."""
        turn = self.tree.get_turn(turn_id)
        if turn.parent_id is None:
            raise InvalidTurnOperation("the system turn cannot be edited; fork the session with a new system prompt")
        return self.begin_turn(turn.session_id, role=turn.role, content=content, token_ids=token_ids,
                               parent_turn_id=turn.parent_id)

    def regenerate(self, turn_id: int) -> Turn:
        """A new streaming sibling of an assistant turn, to be filled and committed."""
        turn = self.tree.get_turn(turn_id)
        if turn.role != "assistant":
            raise InvalidTurnOperation(f"only assistant turns can be regenerated; turn {turn_id} is {turn.role}")
        return self.begin_turn(turn.session_id, role="assistant", parent_turn_id=turn.parent_id)

    def set_head(self, session: SessionRef, turn_id: int, *, descend: bool = True) -> Turn:
        """Move the head to `turn_id`, then (if `descend`) down its newest children to a leaf."""
        s = self.core.get_session(session)
        with self.core.transaction():
            self.leases.guard(s.id)
            turn = self.tree.get_turn(turn_id)
            if turn.session_id != s.id:
                raise TurnNotFound(turn_id, s.uid)
            while descend:
                row = self.core.one("SELECT id FROM turns WHERE parent_id = ? ORDER BY id DESC LIMIT 1", [turn.id])
                if row is None:
                    break
                turn = self.tree.get_turn(row[0])
            self._move_head(s.id, turn.id)
        return turn
