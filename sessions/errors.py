"""Errors raised by the session store.

Every error is a `SessionError` whose message is one line that names the cause and the way
out, so the CLI can print it as is and the chat service can show it without rewording.
"""

from __future__ import annotations

from typing import Sequence


def _rebuild_hint(session_uid: str) -> str:
    return f"laplace chat --session {session_uid[:8]} --rebuild-state"


class SessionError(Exception):
    """Base class of every error the session store raises on purpose."""


class SessionNotFound(SessionError):
    def __init__(self, ref: object) -> None:
        super().__init__(f"no session matches {ref!r}; see `laplace sessions list --all`")
        self.ref = ref


class AmbiguousSessionId(SessionError):
    def __init__(self, prefix: str, candidates: Sequence[str]) -> None:
        shown = ", ".join(c[:12] for c in candidates[:10])
        more = f" (+{len(candidates) - 10} more)" if len(candidates) > 10 else ""
        super().__init__(
            f"session id prefix {prefix!r} matches {len(candidates)} sessions: {shown}{more}; "
            "type more characters of the id"
        )
        self.prefix = prefix
        self.candidates = list(candidates)


class TurnNotFound(SessionError):
    def __init__(self, turn_id: int, session_uid: str | None = None) -> None:
        where = f" in session {session_uid[:8]}" if session_uid else ""
        super().__init__(f"no turn {turn_id}{where}; see `laplace sessions show`")
        self.turn_id = turn_id


class InvalidTurnOperation(SessionError):
    """A write that would break the transcript's invariants (e.g. rewriting a turn with children)."""


class DamagedTokenIds(SessionError):
    """A turn's stored token ids are not a whole number of int32s (the file was edited or
    damaged). No state can be built from them, so the way out is not a rebuild but a fork
    that keeps the branch before the turn."""

    def __init__(self, session_uid: str, turn_id: int, parent_id: int | None, size: object) -> None:
        way_out = (f"keep the part before it with `laplace sessions fork {session_uid[:8]} --at {parent_id}`"
                   if parent_id is not None else
                   f"it is the system turn: export the text with `laplace sessions export {session_uid[:8]}` "
                   "and start a new session")
        super().__init__(f"turn {turn_id} of session {session_uid[:8]} has damaged token ids ({size}, not whole "
                         f"4-byte ids), so no state can be built from it; {way_out}")
        self.session_uid = session_uid
        self.turn_id = turn_id


class SessionInUse(SessionError):
    def __init__(self, session_uid: str, pid: int, hostname: str, expires_in_s: float) -> None:
        super().__init__(
            f"session {session_uid[:8]} in use by pid {pid} on {hostname} "
            f"(lease expires in {max(expires_in_s, 0):.0f}s unless renewed); "
            "close the other laplace or fork the session: laplace sessions fork "
            f"{session_uid[:8]}"
        )
        self.session_uid = session_uid
        self.pid = pid
        self.hostname = hostname
        self.expires_in_s = expires_in_s


class SchemaTooOld(SessionError):
    def __init__(self, path: object, pending: Sequence[str]) -> None:
        super().__init__(
            f"database {path} needs migrations ({', '.join(pending)}) and was opened read-only; "
            "run any writing laplace command (e.g. `laplace sessions list`) once to migrate it"
        )


class ForeignDatabase(SessionError):
    """The database file holds another program's tables: laplace does not write into it."""

    def __init__(self, path: object, tables: Sequence[str]) -> None:
        shown = ", ".join(tables[:5]) + (f" (+{len(tables) - 5} more)" if len(tables) > 5 else "")
        super().__init__(
            f"{path} is an SQLite database of another program (tables: {shown}), so laplace leaves it alone; "
            "move it aside, or set LAPLACE_HOME to another directory"
        )


class StateError(SessionError):
    """A stored state that cannot be trusted; the way out is always a replay of the transcript."""

    def __init__(self, session_uid: str, turn_id: int, cause: str) -> None:
        super().__init__(
            f"stored state for session {session_uid[:8]} turn {turn_id} {cause}; rebuild it by "
            f"replaying the transcript: {_rebuild_hint(session_uid)}"
        )
        self.session_uid = session_uid
        self.turn_id = turn_id


class StateChecksumError(StateError):
    def __init__(self, session_uid: str, turn_id: int, detail: str = "sha256 mismatch") -> None:
        super().__init__(session_uid, turn_id, f"is corrupt ({detail})")


class StateModelMismatch(StateError):
    def __init__(self, session_uid: str, turn_id: int, stored: str, expected: str) -> None:
        super().__init__(
            session_uid,
            turn_id,
            f"was made by another model (fingerprint {stored[:12]}, this model is {expected[:12]})",
        )
        self.stored = stored
        self.expected = expected


class StateTranscriptMismatch(StateError):
    def __init__(self, session_uid: str, turn_id: int, detail: str) -> None:
        super().__init__(session_uid, turn_id, f"disagrees with the transcript ({detail})")
