"""Recovery and integrity checks that `ChatService` runs when it takes a session.

Split from `agent/chat/service.py` to keep that file to the turn loop; the replay itself is
`replay.py`. Three jobs:

- `fold_interrupted`: a reply whose writer crashed mid-stream is kept (marked cancelled by
  the lease) but was never folded into the state; fold its kept text now, so the promise
  "the state has read exactly the stored text" holds after a crash too.
- `check_token_chain`: the cheap integrity check on resume. The snapshot check compares
  recorded hashes only; recomputing the chain from the stored ids (hashing, no replay)
  also catches an earlier turn whose ids were edited in place.
- `prepare_rebuild`: before a replay, recompute the chain from the ids as stored, give an
  interrupted reply its ids, and refuse ids the model cannot read; `rebuild` then replays
  the branch into a fresh state with progress (`ChatService.rebuild_state`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Generator

from agent.chat.browse import guarded
from agent import timings
from agent.chat.replay import Progress, Replaying, load_state, replay
from agent.chat.types import ChatError, ProgressEvent, StateUnusableError
from sessions import InvalidTurnOperation, Session, SessionError, SessionStore, StateError, Turn

if TYPE_CHECKING:
    from agent.runtime.state import RecurrentState


def fold_interrupted(service: Replaying, session: Session, *, with_state: bool = True,
                     progress: Progress | None = None) -> None:
    """Fold the kept text of a reply that a crashed writer left streaming into the state.

    Taking the lease marked such a reply cancelled with its flushed text but no token ids
    (the writer died before committing them), so the state had not read it. It is the head
    (nothing can be added after a streaming turn), so its ids can still be written: the
    template around the kept text, committed with the state after it in one transaction.
    If the state before it cannot be loaded (corrupt, or perhaps not the session's own
    model, whose tokenizer must not write its ids) nothing is written: the rebuild offered
    next calls this with `with_state=False`, storing the ids that it then replays.
    """
    store = service.store
    head = store.tree.get_turn(store.core.get_session(session.id).head_turn_id)
    if head.role != "assistant" or head.status not in ("cancelled", "error") or head.n_tokens:
        return
    tok, template = service.lm.tokenizer, service.lm.template
    ids = [*template.reply_prefix(tok), *tok.encode(head.content), *template.reply_suffix(tok)]
    blob = meta = None
    if with_state:
        try:
            _, after = service.runner.prefill(ids, load_state(service, session, head.parent_id, progress=progress))
        except StateUnusableError:
            return
        blob, meta = service._blob(after), service._meta(after)
    try:
        store.turns.commit_turn(head.id, status=head.status, token_ids=ids, state=blob, state_meta=meta)
    except InvalidTurnOperation:  # a state was stored after it before this fix: left unread
        return
    except SessionError as exc:
        raise ChatError(str(exc)) from None


def check_token_chain(store: SessionStore, session: Session) -> None:
    """Raise StateUnusableError (the way out: rebuild) if the stored token ids along the
    head's branch do not give their recorded hash chain; ChatError (the way out: a fork
    before the turn, which a rebuild could not help) if some of them are damaged."""
    try:
        with timings.phase("hash chain: recompute over the branch"):
            store.chain.check_chain(session.id)
    except StateError as exc:
        raise StateUnusableError(str(exc)) from None
    except SessionError as exc:
        raise ChatError(str(exc)) from None


def prepare_rebuild(service: Replaying, session: Session) -> Turn:
    """Ready the branch for a replay into a fresh state; returns its head.

    The replay reads the token ids as stored, so the recorded chain is recomputed from them
    (ids edited in place) and snapshots that no longer match are dropped. Ids that cannot be
    replayed at all (damaged blobs, ids outside the model's vocabulary) are refused first,
    before anything is written, with the way to keep the undamaged part.
    """
    store = service.store
    vocab = service.lm.config.vocab_size
    for turn in guarded(lambda: store.tree.branch(session.id)):
        ids = guarded(lambda: store.tree.turn_token_ids(turn.id))
        if ids and not 0 <= min(ids) <= max(ids) < vocab:
            raise ChatError(f"turn {turn.id} holds token ids this model does not have; keep the part before "
                            f"it with `laplace sessions fork {session.uid[:8]} --at {turn.parent_id}`")
    guarded(lambda: store.chain.rechain(session.id))
    fold_interrupted(service, session, with_state=False)
    return store.tree.get_turn(store.core.get_session(session.id).head_turn_id)


def rebuild(service: Replaying, session: Session,
            cancel: threading.Event | None) -> Generator[ProgressEvent, None, RecurrentState | None]:
    """Replay the branch's stored ids into a fresh state, with progress, and store it at the
    head; returns that state, or None when `cancel` stopped it (then nothing is stored)."""
    head = prepare_rebuild(service, session)
    state, done = service.fresh_state(), 0
    turns = replay(service.runner, service.store, session.id, head.id, state)
    while True:
        if cancel is not None and cancel.is_set():  # between segments: nothing is stored
            yield ProgressEvent("rebuild cancelled", done, head.tokens_total)
            return None
        try:
            done, state = next(turns)
        except StopIteration:
            break
        yield ProgressEvent("replaying transcript", done, head.tokens_total)
    if head.status == "streaming":
        raise ChatError(f"turn {head.id} is still being written by another process")
    service.store.states.put(head.id, service._blob(state), service._meta(state))
    return state
