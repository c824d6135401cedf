"""The one replay: a branch's stored token ids folded into a state, turn by turn.

A stored state is a cache of "the model after reading exactly these tokens"; the transcript
is the truth. Whatever rebuilds or checks that cache reads the ids the same way, through
`replay`: `load_state` (the newest snapshot on the branch, then the turns stored after it:
resume, regenerate, switching branches), `ChatService.rebuild_state` (the whole branch into
a fresh state, with progress) and `laplace sessions verify --replay` (`verify.py`, which
compares a replay with the stored state). `recovery.py`, beside it, readies a branch for a
replay and folds what a crashed writer left unread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol

from agent.chat.types import StateUnusableError
from sessions import Session, SessionStore, StateError

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.generation import EagerRunner
    from agent.runtime.state import RecurrentState


class Replaying(Protocol):
    """What a replay uses of `ChatService` (spelled out so this module need not import it)."""

    store: SessionStore
    lm: LoadedModel
    runner: EagerRunner
    model_id: str
    fingerprint: str


def replay(runner: EagerRunner, store: SessionStore, session_id: int, turn_id: int, state: RecurrentState, *,
           after_turn_id: int | None = None) -> Iterator[tuple[int, RecurrentState]]:
    """Fold the stored ids of the branch up to `turn_id` (only those after `after_turn_id`,
    when given) into `state`; yields (tokens folded so far, state) after each turn, so a
    caller can report progress or stop between turns."""
    done = 0
    for ids in store.tree.branch_token_ids(session_id, turn_id, after_turn_id=after_turn_id):
        if ids:
            _, state = runner.prefill(ids, state)
        done += len(ids)
        yield done, state


def replayed(runner: EagerRunner, store: SessionStore, session_id: int, turn_id: int, state: RecurrentState, *,
             after_turn_id: int | None = None) -> RecurrentState:
    """`replay` to the end: the state after the whole stretch."""
    for _, state in replay(runner, store, session_id, turn_id, state, after_turn_id=after_turn_id):
        pass
    return state


def load_state(service: Replaying, session: Session, turn_id: int | None = None) -> RecurrentState:
    """The state after `turn_id` (default: head) from the newest snapshot on the branch,
    folding any turns stored after it (e.g. a user message whose reply crashed). Raises
    StateUnusableError, naming the way out, when no stored state can be trusted."""
    from agent.runtime.state import RecurrentState, StateError as RuntimeStateError

    store = service.store
    try:
        turn = store.tree.get_turn(turn_id if turn_id is not None else session.head_turn_id)
        snap = store.states.latest(session.id, turn.id)
        if snap is None:
            raise StateUnusableError(
                f"session {session.uid[:8]} has no stored state on this branch; rebuild it by replaying the transcript (--rebuild-state)")
        data = store.states.load(snap, expected_fingerprint=service.fingerprint)
        state = RecurrentState.from_bytes(data, config=service.lm.config, fingerprint=service.fingerprint,
                                          device=service.runner.device)
    except (StateError, RuntimeStateError) as exc:
        hint = f" (the session was made with model {session.model_id!r})" if session.model_id != service.model_id else \
            " (if the session was started with --initial-state or another LAPLACE_DTYPE, use the same again)"
        # The runtime's own messages only say "replay the transcript": name the way to do it.
        how = "" if "--rebuild-state" in str(exc) else \
            f"; to replay the transcript: laplace chat --session {session.uid[:8]} --rebuild-state"
        raise StateUnusableError(f"{exc}{hint}{how}") from None
    state.n_tokens = snap.n_tokens
    if turn.tokens_total > snap.n_tokens:
        state = replayed(service.runner, store, session.id, turn.id, state, after_turn_id=snap.turn_id)
    return state
