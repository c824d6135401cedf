"""`laplace sessions verify`: a deep check that a session's state agrees with its transcript.

Two levels. `verify_session` needs only the store: recompute the token-stream hash chain
from every stored token id on the current branch, and check each snapshot on it (checksum,
token count, chain hash). `compare_replay` also needs the model, which the CLI loads and
passes in: the branch up to its newest snapshot goes through the one replay (`replay.py`)
into a fresh state, compared with the stored one tensor by tensor. Resume runs only the
hashing part of the first level (`recovery.py`); this is the slow, thorough one. Torch is
imported only for the comparison, so the default check stays light.

A failed check raises `VerifyFailed` with one line that names the cause and the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.chat.replay import replayed
from sessions import Session, SessionError, SessionStore, Snapshot, StateError

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.generation import EagerRunner



class VerifyFailed(Exception):
    """A check failed; the message is the one line to print."""


@dataclass(frozen=True)
class ReplayResult:
    turn_id: int
    n_tokens: int
    row_difference: float  # the largest relative difference of a row (runtime.state_compare)
    max_difference: float  # the largest elementwise difference
    within: str = "accumulation order"  # what the bar it passed allows for

    def line(self) -> str:
        return (f"replay: the stored state after turn {self.turn_id} ({self.n_tokens:,} tokens) matches a fresh replay "
                f"of the transcript (largest relative row difference {self.row_difference:.2g}, elementwise "
                f"{self.max_difference:.2g}: within {self.within})")


def _rebuild(uid: str) -> str:
    return f"laplace chat --session {uid[:8]} --rebuild-state"


def verify_session(store: SessionStore, ref: str) -> list[str]:
    """The report lines of a passed chain and snapshot check; raises VerifyFailed otherwise."""
    s = store.core.get_session(ref)
    try:
        tokens = store.chain.check_chain(s.id)  # names the first turn whose ids are damaged or break the chain
        turns = store.states.verify_branch(s.id)  # then every snapshot on the branch, bytes included
    except SessionError as exc:  # a StateError (rebuild) or damaged ids (fork before them)
        raise VerifyFailed(str(exc)) from None
    head = store.tree.get_turn(s.head_turn_id)
    snaps = [x for x in store.states.all(s.id) if x.turn_id in {t.id for t in store.tree.branch(s.id)}]
    if not snaps:  # the chain alone says nothing about a state: there is none to check
        raise VerifyFailed(f"session {s.short_id} has no stored state on this branch, so it is not verified "
                           f"(its hash chain over {turns} turns matches); make one by replaying the transcript: "
                           f"{_rebuild(s.uid)}")
    lines = [f"session {s.short_id}: hash chain recomputed over {turns} turns ({tokens:,} tokens) matches; "
             f"{len(snaps)} snapshot(s) on this branch pass checksum and chain checks"]
    if head.status == "streaming":
        lines.append(f"note: turn {head.id} is still streaming (a writer is busy or crashed); it is checked once committed")
    return lines


def newest_snapshot(store: SessionStore, ref: str) -> tuple[Session, Snapshot]:
    """The session and the snapshot a replay is compared with; VerifyFailed when there is none."""
    s = store.core.get_session(ref)
    snap = store.states.latest(s.id)
    if snap is None:
        raise VerifyFailed(f"session {s.short_id} has no stored state on this branch to compare; "
                           f"make one by replaying the transcript: {_rebuild(s.uid)}")
    return s, snap


def compare_replay(store: SessionStore, s: Session, snap: Snapshot, lm: LoadedModel, runner: EagerRunner) -> ReplayResult:
    """Replay the branch up to `snap` into a fresh state of `lm` and compare it with `snap`."""

    from agent.runtime.state import RecurrentState, StateError as RuntimeStateError

    device = runner.device
    try:
        data = store.states.load(snap, expected_fingerprint=lm.fingerprint)
        stored = RecurrentState.from_bytes(data, config=lm.config, fingerprint=lm.fingerprint, device=device)
    except StateError as exc:
        raise VerifyFailed(f"{exc} (or pass the model it was made with: -m MODEL; a session started with "
                           "--initial-state cannot be replayed here)") from None
    except RuntimeStateError as exc:
        raise VerifyFailed(f"stored state for session {s.short_id} turn {snap.turn_id} cannot be read ({exc}); "
                           f"rebuild it by replaying the transcript: {_rebuild(s.uid)}") from None
    from agent.runtime.state_compare import INT8_ROW_TOLERANCE, ROW_TOLERANCE, compare, worst

    state = replayed(runner, store, s.id, snap.turn_id, lm.model.new_state(1))
    # Row by row, relative to each row's size: a replay folds whole turns where the stored
    # state stepped through replies token by token, and deep layers' keys differ by
    # accumulation order far above an elementwise 1e-4; one wrong or missing token moves
    # the rows that hold it by O(1) (state_compare's docstring has the measurements).
    try:
        parts = compare(stored, state)
    except ValueError as exc:
        raise VerifyFailed(f"stored state for session {s.short_id} turn {snap.turn_id} does not fit the model ({exc}); "
                           f"rebuild it by replaying the transcript: {_rebuild(s.uid)}") from None
    bad = worst(parts)
    max_abs = max(p.max_abs for p in parts)
    # int8 weights: two runtimes round differently, and a session may hold both's states
    int8 = lm.card.get("weights") == "int8"
    bar, why = (INT8_ROW_TOLERANCE, "the int8 runtimes' roundings") if int8 else (ROW_TOLERANCE, "accumulation order")
    if bad.worst > bar:
        raise VerifyFailed(f"stored state for session {s.short_id} turn {snap.turn_id} differs from a fresh replay "
                           f"of the transcript ({bad.name} row {list(bad.where)} differs by {bad.worst:.3g} of its size, "
                           f"more than {why}'s {bar:g}); rebuild it by replaying the "
                           f"transcript: {_rebuild(s.uid)}")
    return ReplayResult(snap.turn_id, snap.n_tokens, bad.worst, max_abs, why)
