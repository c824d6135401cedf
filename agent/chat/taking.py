"""Taking a session without running the model: what the server's admission may do.

`TurnWriter.open` (what `laplace chat` does on resume) folds a reply a crashed writer left
unread and replays the turns stored after the newest snapshot, on the caller's thread. The
server cannot afford that at admission: its scheduler thread is stepping every other reply
and holds the store's write transaction. So here a session is taken with bookkeeping only
(lease, options, the interrupted reply's ids stored, the token chain hashed, the newest
snapshot on the branch read), and what the state still has to read comes back as `owed`
ids, which the caller folds through its own segmented prefill, interleaved with decoding.
A new session is stored with its system prompt's ids and no state: the system prompt is
owed too, and the first commit stores the state after all of it.

A branch with no snapshot at all (a new session whose first reply never committed a
state) starts from the writer's fresh state and owes the whole branch: a replay from the
start, read like any prompt.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from agent.chat.options import SessionOptions
from agent.chat.recovery import check_token_chain, fold_interrupted
from agent.chat.replay import load_state
from agent.chat.turns import TurnWriter, check_text, guard_store
from agent.chat.types import ChatError, SessionNotFoundError
from sessions import AmbiguousSessionId, Lease, Session, SessionError, SessionNotFound

log = logging.getLogger("laplace.serve")


class AmbiguousSessionError(ChatError):
    """A session id prefix matched more than one session (which ones is not said)."""

if TYPE_CHECKING:
    from agent.runtime.state import RecurrentState


@dataclass
class Taken:
    """A session this writer holds the lease of; `state` has read all of the branch but `owed`."""

    session: Session
    lease: Lease
    options: SessionOptions
    state: RecurrentState
    owed: list[int]


def find_unlisted(writer: TurnWriter, ref: str) -> Session:
    """The session `ref` (an id or a unique prefix) names. Unlike the store's own message,
    the refusal of an ambiguous prefix does not list the ids it matched: for a server, ids
    are what keeps one client out of another's sessions."""
    try:
        return writer.store.core.get_session(ref)
    except AmbiguousSessionId:
        raise AmbiguousSessionError(f"session {ref!r} is the start of more than one session id; "
                                    "send more of the id") from None
    except SessionNotFound:
        raise SessionNotFoundError(f"no session matches {ref!r}; leave out session to start a new one") from None
    except SessionError as exc:
        raise ChatError(str(exc)) from None


def release(lease: Any) -> None:
    """Give a lease back. One already gone (taken over after a stall, or its session
    deleted) is what the store says with a SessionError: expected, logged. Anything else is
    a bug or a broken store: logged with its traceback, not swallowed."""
    if lease is None:
        return
    try:
        lease.release()
    except SessionError as exc:
        log.info("lease already gone: %s", exc)
    except Exception:
        log.exception("releasing a lease failed")


def start_session(writer: TurnWriter, *, system: str, name: str | None, options: SessionOptions) -> Taken:
    """A new session, leased: its system prompt stored (ids, no state) and owed."""
    check_text(system, "system prompt")
    lm = writer.lm
    ids = lm.template.message(lm.tokenizer, "system", system, first=True)
    session: Session = guard_store(lambda: writer.store.turns.create_session(  # type: ignore[assignment]
        model_id=writer.model_id, system_prompt=system, system_token_ids=ids, name=name, options=options.stored()))
    lease = writer.lease(session)
    return Taken(session, lease, options, writer.fresh_state(), list(ids))


class Recent:
    """What one writer left its sessions at: the head turn of each (its chain verified, as
    this writer wrote it) and, for the `max_states` most recent, the state after that head.

    A session still at the head it was left at (nobody wrote to it since) is not hashed
    again and, when its state is kept, not read back from the store either: a long session
    costs O(its history) once per server, and a busy one no state load per request."""

    def __init__(self, max_states: int = 16) -> None:
        self.max_states = max_states
        self.heads: dict[int, int] = {}
        self.states: OrderedDict[int, tuple[int, RecurrentState]] = OrderedDict()

    def left(self, session_id: int, head_turn_id: int, state: RecurrentState | None) -> None:
        self.heads[session_id] = head_turn_id
        self.states.pop(session_id, None)
        if state is not None and self.max_states > 0:
            self.states[session_id] = (head_turn_id, state)
            while len(self.states) > self.max_states:
                self.states.popitem(last=False)

    def take_state(self, session_id: int, head_turn_id: int) -> RecurrentState | None:
        """The kept state after `head_turn_id`, handed over (it is not kept twice)."""
        kept = self.states.pop(session_id, None)
        return kept[1] if kept is not None and kept[0] == head_turn_id else None


def take_session(writer: TurnWriter, ref: str | int, given: Mapping[str, object], *,
                 recent: Recent | None = None) -> Taken:
    """A stored session, leased, with its newest snapshot and the ids stored after it.
    Raises what `TurnWriter.open` raises (not found, busy, state unusable)."""
    session = writer.find(ref)
    lease = writer.lease(session)
    try:
        options, session = writer.adopt_options(session, given)
        fold_interrupted(writer, session, with_state=False)  # its ids stored; owed below like any turn
        session = writer.find(session.id)
        ours = recent is not None and recent.heads.get(session.id) == session.head_turn_id
        if not ours:
            check_token_chain(writer.store, session)
        kept = recent.take_state(session.id, session.head_turn_id) if recent is not None and ours else None
        if kept is not None:
            return Taken(session, lease, options, kept, [])
        state, owed = _snapshot_and_rest(writer, session)
        return Taken(session, lease, options, state, owed)
    except BaseException:
        lease.release()
        raise


def _snapshot_and_rest(writer: TurnWriter, session: Session) -> tuple[RecurrentState, list[int]]:
    store = writer.store
    snap = guard_store(lambda: store.states.latest(session.id, session.head_turn_id))
    if snap is None:
        state, after = writer.fresh_state(), None
    else:
        # The snapshot's own turn: `load_state` reads and checks it and has nothing to fold.
        state, after = load_state(writer, session, snap.turn_id), snap.turn_id  # type: ignore[attr-defined]
    owed = [i for ids in guard_store(lambda: list(store.tree.branch_token_ids(  # type: ignore[union-attr]
        session.id, session.head_turn_id, after_turn_id=after))) for i in ids]
    return state, owed
