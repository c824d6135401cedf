"""The one replay: a branch's stored token ids folded into a state, turn by turn.

A stored state is a cache of "the model after reading exactly these tokens"; the transcript
is the truth. Whatever rebuilds or checks that cache reads the ids the same way, through
`replay`: `load_state` (the newest snapshot on the branch, then the turns stored after it:
resume, regenerate, switching branches), `ChatService.rebuild_state` (the whole branch into
a fresh state, with progress) and `laplace sessions verify --replay` (`verify.py`, which
compares a replay with the stored state). `recovery.py`, beside it, readies a branch for a
replay and folds what a crashed writer left unread.

Ids are folded one prefill segment at a time (`fold`, the same segments `runner.prefill`
cuts), so a turn of a million tokens reports progress as it goes and the state is the one a
single `prefill` would give.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence, runtime_checkable

from agent import timings
from agent.chat.browse import guarded
from agent.chat.types import ProgressEvent, StateUnusableError
from sessions import Session, SessionStore, StateError, StateMeta

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.decoding import Runner
    from agent.runtime.state import RecurrentState


@runtime_checkable
class Replaying(Protocol):
    """What a replay uses of `ChatService` and of `turns.TurnWriter` (spelled out so this
    module need not import them); both satisfy it, which a test holds with isinstance."""

    store: SessionStore
    lm: LoadedModel
    runner: Runner
    model_id: str
    fingerprint: str

    def fresh_state(self) -> RecurrentState: ...

    def _blob(self, state: RecurrentState) -> bytes: ...

    def _meta(self, state: RecurrentState) -> StateMeta: ...


Progress = Callable[[ProgressEvent], None]


def fold(runner: Runner, ids: Sequence[int], state: RecurrentState) -> Iterator[tuple[int, RecurrentState]]:
    """Fold `ids` into `state` one prefill segment at a time; yields (ids folded so far,
    state) after each segment. The segments are those `runner.prefill(ids)` would cut."""
    step = runner.segment_len
    for start in range(0, len(ids), step):
        _, state = runner.prefill(ids[start:start + step], state)
        yield min(start + step, len(ids)), state


def replay(runner: Runner, store: SessionStore, session_id: int, turn_id: int, state: RecurrentState, *,
           after_turn_id: int | None = None) -> Iterator[tuple[int, RecurrentState]]:
    """Fold the stored ids of the branch up to `turn_id` (only those after `after_turn_id`,
    when given) into `state`; yields (tokens folded so far, state) after each prefill
    segment, so a caller can report progress or stop between segments."""
    done = 0
    for ids in store.tree.branch_token_ids(session_id, turn_id, after_turn_id=after_turn_id):
        base = done
        for n, state in fold(runner, ids, state):
            done = base + n
            yield done, state


def replayed(runner: Runner, store: SessionStore, session_id: int, turn_id: int, state: RecurrentState, *,
             after_turn_id: int | None = None) -> RecurrentState:
    """`replay` to the end: the state after the whole stretch."""
    for _, state in replay(runner, store, session_id, turn_id, state, after_turn_id=after_turn_id):
        pass
    return state


def load_state(service: Replaying, session: Session, turn_id: int | None = None, *,
               progress: Progress | None = None) -> RecurrentState:
    """The state after `turn_id` (default: head) from the newest snapshot on the branch,
    folding any turns stored after it (e.g. a message whose fold or reply was interrupted),
    with `progress`, and storing the state after them, so that the next open loads it
    instead of folding them again. Raises StateUnusableError, naming the way out, when no
    stored state can be trusted."""
    from agent.runtime.state_format import StateError as RuntimeStateError

    store = service.store
    with timings.phase("state: read, check and load the snapshot"):
        try:
            turn = store.tree.get_turn(turn_id if turn_id is not None else session.head_turn_id)
            snap = store.states.latest(session.id, turn.id)
            if snap is None:
                raise StateUnusableError(
                    f"session {session.uid[:8]} has no stored state on this branch; rebuild it by replaying the transcript (--rebuild-state)")
            data = store.states.load(snap, expected_fingerprint=service.fingerprint)
            state = service.runner.load_state(data, config=service.lm.config, fingerprint=service.fingerprint)
        except (StateError, RuntimeStateError) as exc:
            hint = f" (the session was made with model {session.model_id!r})" if session.model_id != service.model_id else \
                " (if the session was started with --initial-state or another LAPLACE_DTYPE, use the same again)"
            # The runtime's own messages only say "replay the transcript": name the way to do it.
            how = "" if "--rebuild-state" in str(exc) else \
                f"; to replay the transcript: laplace chat --session {session.uid[:8]} --rebuild-state"
            raise StateUnusableError(f"{exc}{hint}{how}") from None
    state.n_tokens = snap.n_tokens
    if turn.tokens_total > snap.n_tokens:
        total = turn.tokens_total - snap.n_tokens
        for done, state in replay(service.runner, store, session.id, turn.id, state, after_turn_id=snap.turn_id):
            if progress is not None:
                progress(ProgressEvent("folding turns stored after the last state", done, total))
        if turn.status != "streaming":  # fold once: a cache of the state after them, like a commit's
            guarded(lambda: store.states.put(turn.id, service._blob(state), service._meta(state)))
    return state
