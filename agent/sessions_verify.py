"""`laplace sessions verify`: a deep check that a session's state agrees with its transcript.

Two levels. The default needs only the store: recompute the token-stream hash chain from
every stored token id on the current branch, and check each snapshot on it (checksum,
token count, chain hash). `replay` also needs the model: fold the branch's token ids into
a fresh state and compare it with the newest stored state, tensor by tensor. Resume runs
only the hashing part of the first level (`agent/chat/recovery.py`); this is the slow,
thorough one. Torch is imported only for the replay, so the default stays light.

A failed check raises `VerifyFailed` with one line that names the cause and the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agent.settings import Settings
from sessions import SessionStore, StateError

# The stored state was built from prefill segments and one-token decode steps; a replay
# folds whole turns in chunks. In fp32 the two agree to accumulation order (a wrong or
# missing token differs by O(1)), the same bound the interrupt tests hold snapshots to.
RTOL, ATOL = 1e-4, 1e-5


class VerifyFailed(Exception):
    """A check failed; the message is the one line to print."""


@dataclass(frozen=True)
class ReplayResult:
    turn_id: int
    n_tokens: int
    max_difference: float


def _rebuild(uid: str) -> str:
    return f"laplace chat --session {uid[:8]} --rebuild-state"


def verify_session(store: SessionStore, ref: str, *, replay: bool = False, model: Optional[str] = None,
                   device: Optional[str] = None) -> list[str]:
    """The report lines of a passed check; raises VerifyFailed otherwise."""
    s = store.get_session(ref)
    try:
        tokens = store.check_chain(s.id)  # names the first turn whose ids break the chain
        turns = store.verify_branch(s.id)  # then every snapshot on the branch, bytes included
    except StateError as exc:
        raise VerifyFailed(str(exc)) from None
    head = store.get_turn(s.head_turn_id)
    snaps = [x for x in store.snapshots(s.id) if x.turn_id in {t.id for t in store.branch(s.id)}]
    lines = [f"session {s.short_id}: hash chain recomputed over {turns} turns ({tokens:,} tokens) matches; "
             f"{len(snaps)} snapshot(s) on this branch pass checksum and chain checks"]
    if head.status == "streaming":
        lines.append(f"note: turn {head.id} is still streaming (a writer is busy or crashed); it is checked once committed")
    if replay:
        r = replay_newest(store, ref, model=model, device=device)
        lines.append(f"replay: the stored state after turn {r.turn_id} ({r.n_tokens:,} tokens) matches a fresh replay "
                     f"of the transcript (max difference {r.max_difference:.2g})")
    return lines


def replay_newest(store: SessionStore, ref: str, *, model: Optional[str] = None,
                  device: Optional[str] = None) -> ReplayResult:
    """Replay the branch up to the newest snapshot into a fresh state and compare."""
    import torch

    from agent.runtime.checkpoint import ModelLoadError, load_model
    from agent.runtime.device import DeviceUnavailableError, resolve_device
    from agent.runtime.generation import EagerRunner
    from agent.runtime.state import RecurrentState, StateError as RuntimeStateError

    s = store.get_session(ref)
    snap = store.latest_snapshot(s.id)
    if snap is None:
        raise VerifyFailed(f"session {s.short_id} has no stored state on this branch to compare; "
                           f"make one by replaying the transcript: {_rebuild(s.uid)}")
    settings = Settings.from_env()
    try:
        dev = resolve_device(device or settings.device)
        lm = load_model(model or s.model_id, device=dev, models_dir=settings.models_dir)
    except (ModelLoadError, DeviceUnavailableError) as exc:
        raise VerifyFailed(str(exc)) from None
    try:
        data = store.load_state(snap, expected_fingerprint=lm.fingerprint)
        stored = RecurrentState.from_bytes(data, config=lm.config, fingerprint=lm.fingerprint, device=dev)
    except StateError as exc:
        raise VerifyFailed(f"{exc} (or pass the model it was made with: -m MODEL; a session started with "
                           "--initial-state cannot be replayed here)") from None
    except RuntimeStateError as exc:
        raise VerifyFailed(f"stored state for session {s.short_id} turn {snap.turn_id} cannot be read ({exc}); "
                           f"rebuild it by replaying the transcript: {_rebuild(s.uid)}") from None
    runner = EagerRunner(lm.model)
    state = lm.model.new_state(1)
    with torch.inference_mode():
        for ids in store.branch_token_ids(s.id, snap.turn_id):
            if ids:
                _, state = runner.prefill(ids, state)
    diff = stored.max_abs_diff(state)
    same = stored.allclose(state, rtol=RTOL, atol=ATOL)
    if not same:
        raise VerifyFailed(f"stored state for session {s.short_id} turn {snap.turn_id} differs from a fresh replay "
                           f"of the transcript (max difference {diff:.3g}); rebuild it by replaying the "
                           f"transcript: {_rebuild(s.uid)}")
    return ReplayResult(snap.turn_id, snap.n_tokens, diff)
