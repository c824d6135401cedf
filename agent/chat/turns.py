"""How a turn is written to the store: one piece that `ChatService` and the server share.

Both front ends (the TUI and `laplace ask` through `ChatService`, `laplace serve` through its
batching scheduler) must leave the same rows behind, so the steps live here once:

1. `TurnWriter.open` takes a session the way `ChatService.resume` does: its lease, its
   stored options with the edge's on top, a reply a crashed writer left unread folded in,
   the token chain checked, its state loaded (no transcript replay when a snapshot fits);
   `TurnWriter.create` starts one the way `ChatService.new_session` does.
2. `store_message` stores the user's message (and the recall block that recall refresh
   chose for it) in one transaction, before anything is generated, and returns the ids the
   caller must fold; `store_history` stores earlier messages of a conversation that arrived
   whole (an OpenAI-style request) as complete turns.
3. `begin_reply` starts the assistant row `streaming`; `ReplyWriter.progress` flushes its
   text every `FLUSH_EVERY_S` and renews the lease every `HEARTBEAT_EVERY_S`;
   `ReplyWriter.commit` closes it complete, cancelled or error with the template's suffix
   folded and the state after it, in one transaction.

The caller owns the model: the writer runs the runner only inside the calls that say so
(`create`, `open`, `commit`), on the caller's thread.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from agent.chat.options import SessionOptions
from agent.chat.recall import RecallRefresh
from agent.chat.recovery import check_token_chain, fold_interrupted
from agent.chat.replay import Progress, load_state
from agent.chat.types import ChatError, SessionBusyError, SessionNotFoundError
from agent.recall.options import RefreshOptions
from agent.runtime.tokenizer import StreamDecoder
from sessions import Lease, Session, SessionError, SessionInUse, SessionNotFound, SessionStore, StateMeta, Turn

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.decoding import Runner
    from agent.runtime.state import RecurrentState

FLUSH_EVERY_S = 0.25  # how often a streaming reply's text is written to SQLite
HEARTBEAT_EVERY_S = 5.0


def guard_store(fn: Callable[[], object]) -> object:
    """Run a store call; its one-line SessionError becomes the matching ChatError."""
    try:
        return fn()
    except SessionNotFound as exc:
        raise SessionNotFoundError(str(exc)) from None
    except SessionInUse as exc:
        raise SessionBusyError(str(exc)) from None
    except SessionError as exc:
        raise ChatError(str(exc)) from None


def check_text(text: str, what: str) -> None:
    """The one-line refusal of text that cannot be stored (lone surrogates: not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ChatError(f"the {what} is not valid UTF-8 text; re-encode it as UTF-8") from None


@dataclass
class OpenedSession:
    """A session this writer holds the lease of, with its options and live state."""

    session: Session
    lease: Lease
    options: SessionOptions
    state: RecurrentState


@dataclass
class StoredMessage:
    """The rows `store_message` wrote and the ids to fold, in order: block, then message."""

    user: Turn
    block: Turn | None
    recall_ids: list[int]
    user_ids: list[int]


@dataclass
class Committed:
    turn: Turn
    state: RecurrentState | None  # None: the fold failed, the turn was stored as error without a state
    tokens_per_s: float | None


class TurnWriter:
    """Writes turns for one model into one store. Satisfies `recovery.RecoveringService`
    and `replay.Replaying`, so recovery and replay run through it."""

    def __init__(self, store: SessionStore, lm: LoadedModel, runner: Runner, *, model_id: str,
                 initial_state: RecurrentState | None = None) -> None:
        self.store = store
        self.lm = lm
        self.runner = runner
        self.model_id = model_id
        self.refresher = RecallRefresh(lm, store)
        # A learned initial state (`laplace finetune --tune state`) is part of what a stored
        # state depends on, so it is folded into the fingerprint every snapshot records.
        self.initial_state = initial_state
        self.fingerprint = lm.fingerprint
        if initial_state is not None:
            digest = hashlib.sha256(initial_state.to_bytes(fingerprint=lm.fingerprint)).hexdigest()
            self.fingerprint = hashlib.sha256(f"{lm.fingerprint}+initial:{digest}".encode()).hexdigest()

    # ---- states as the store keeps them ----------------------------------------------

    def fresh_state(self) -> RecurrentState:
        if self.initial_state is not None:
            return self.initial_state.clone().to(self.runner.device)
        return self.runner.new_state()

    def _meta(self, state: RecurrentState) -> StateMeta:
        return StateMeta(model_fingerprint=self.fingerprint, n_tokens=state.n_tokens, dtype="float32")

    def _blob(self, state: RecurrentState) -> bytes:
        return state.to_bytes(fingerprint=self.fingerprint, architecture=self.lm.config.architecture())

    # ---- sessions ---------------------------------------------------------------------

    def create(self, *, system: str, name: str | None, options: SessionOptions) -> tuple[Session, RecurrentState]:
        """A new session: the system prompt folded and stored with its state (no lease yet)."""
        check_text(system, "system prompt")
        ids = self.lm.template.message(self.lm.tokenizer, "system", system, first=True)
        _, state = self.runner.prefill(ids, self.fresh_state())
        session = guard_store(lambda: self.store.turns.create_session(
            model_id=self.model_id, system_prompt=system, system_token_ids=ids, name=name,
            options=options.stored(), state=self._blob(state), state_meta=self._meta(state)))
        return session, state  # type: ignore[return-value]

    def lease(self, session: Session) -> Lease:
        """Become the session's writer (SessionBusyError when another process is)."""
        return guard_store(lambda: self.store.leases.acquire(session))  # type: ignore[return-value]

    def find(self, ref: str | int) -> Session:
        return guard_store(lambda: self.store.core.get_session(ref))  # type: ignore[return-value]

    def adopt_options(self, session: Session, given: Mapping[str, object]) -> tuple[SessionOptions, Session]:
        """A session's stored options with the edge's on top; stored again when that changes
        them (or when an older database held them as text). Needs the lease."""
        try:
            options = SessionOptions().with_values(session.options).with_values(given)
        except ValueError as exc:
            raise ChatError(f"session {session.uid[:8]} has a stored option that cannot be used: {exc}") from None
        if options.stored() != session.options:
            session = guard_store(lambda: self.store.turns.set_options(session.id, options.stored()))  # type: ignore[assignment]
        return options, session

    def recover(self, session: Session, *, progress: Progress | None = None) -> RecurrentState:
        """What taking a session does after its lease: fold a reply a crashed writer left
        unread, check the token chain, load the state (StateUnusableError names the way out);
        a long fold reports to `progress`."""
        fold_interrupted(self, session, progress=progress)
        check_token_chain(self.store, session)
        return load_state(self, session, progress=progress)

    def open(self, ref: str | int, given: Mapping[str, object]) -> OpenedSession:
        """`ChatService.resume`'s steps for a caller that holds the session per request."""
        session = self.find(ref)
        lease = self.lease(session)
        try:
            options, session = self.adopt_options(session, given)
            state = self.recover(session)
            return OpenedSession(self.find(session.id), lease, options, state)
        except BaseException:
            lease.release()
            raise

    # ---- turns ------------------------------------------------------------------------

    def store_history(self, session: Session, messages: Sequence[tuple[str, str]]) -> list[int]:
        """Earlier (role, text) messages of a conversation that arrived whole, stored as
        complete user and assistant turns with the exact ids a reply would have; returns the
        ids to fold, in order. They get no state: the next commit's state covers them."""
        tok, template = self.lm.tokenizer, self.lm.template
        ids: list[int] = []

        def write() -> None:
            for role, text in messages:
                check_text(text, "message")
                if role == "user":
                    turn_ids = template.message(tok, "user", text)
                    self.store.turns.begin_turn(session.id, role="user", content=text, token_ids=turn_ids)
                else:
                    turn_ids = [*template.reply_prefix(tok), *tok.encode(text), *template.reply_suffix(tok)]
                    turn = self.store.turns.begin_turn(session.id, role="assistant")
                    self.store.turns.commit_turn(turn.id, content=text, status="complete", token_ids=turn_ids)
                ids.extend(turn_ids)

        with self.store.core.transaction():
            guard_store(write)
        return ids

    def store_message(self, session: Session, text: str, refresh: RefreshOptions) -> StoredMessage:
        """The user's message (and a recall block before it, if refresh picks one), stored in
        one transaction before generation starts."""
        check_text(text, "message")
        ids = self.lm.template.message(self.lm.tokenizer, "user", text)
        recall = guard_store(lambda: self.refresher.plan(session, text, refresh))
        block, user = guard_store(lambda: self.refresher.store_with_message(session, recall, text, ids))  # type: ignore[misc]
        return StoredMessage(user, block, list(recall.token_ids) if recall is not None else [], ids)  # type: ignore[union-attr]

    def prompt_tail(self, turn_id: int, prefix: Sequence[int]) -> list[int]:
        """What the repetition penalty sees of the prompt (`reply.PROMPT_TAIL` ids): the end
        of the branch up to `turn_id` (the user's message), then the reply's `prefix`. Chat
        and the server both ask here, so a reply's penalty does not depend on the front end."""
        from agent.runtime.reply import PROMPT_TAIL

        need = max(0, PROMPT_TAIL - len(prefix))
        parts: list[list[int]] = []
        got, at = 0, turn_id
        while got < need and at is not None:  # nearest turns first, a few indexed reads
            turn = self.store.tree.get_turn(at)
            ids = self.store.tree.turn_token_ids(turn.id) if turn.n_tokens else []
            parts.append(ids)
            got += len(ids)
            at = turn.parent_id
        ids = [i for part in reversed(parts) for i in part]
        return [*ids[len(ids) - need:], *prefix][-PROMPT_TAIL:] if need else list(prefix)[-PROMPT_TAIL:]

    def begin_reply(self, session: Session, lease: Lease | None, *, regenerate_of: int | None = None) -> ReplyWriter:
        """The assistant row, `streaming` from now on (a sibling of `regenerate_of` if given)."""
        if regenerate_of is not None:
            turn = guard_store(lambda: self.store.turns.regenerate(regenerate_of))
        else:
            turn = guard_store(lambda: self.store.turns.begin_turn(session.id, role="assistant"))
        return ReplyWriter(self, turn, self.lm.template.reply_prefix(self.lm.tokenizer), lease)  # type: ignore[arg-type]


@dataclass
class ReplyWriter:
    """One streaming reply's persistence. `prefix` are the ids that open it; the caller
    folds them before sampling."""

    writer: TurnWriter
    turn: Turn
    prefix: list[int]
    lease: Lease | None
    t0: float = field(default_factory=time.monotonic)
    last_flush: float = field(init=False)
    last_beat: float = field(init=False)

    _decoder: StreamDecoder = field(init=False)
    _text: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.last_flush = self.last_beat = self.t0
        self._decoder = StreamDecoder(self.writer.lm.tokenizer)

    def progress(self, tokens: Sequence[int], now: float | None = None) -> None:
        """Flush the text so far when it is due, and renew the lease when that is due.

        `tokens` is the reply so far (it only grows); only the tokens new since the last
        flush are decoded, so a long reply costs O(new tokens) per flush, not O(reply)."""
        now = time.monotonic() if now is None else now
        if now - self.last_flush > FLUSH_EVERY_S:
            for token in tokens[len(self._decoder.ids):]:
                self._text += self._decoder.push(token)
            self.writer.store.turns.update_streaming(self.turn.id, self._text)
            self.last_flush = now
        self.heartbeat(now)

    def heartbeat(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self.last_beat > HEARTBEAT_EVERY_S and self.lease is not None:
            self.lease.heartbeat()
            self.last_beat = now

    def commit(self, tokens: Sequence[int], *, status: str, error: str | None, stop_reason: str | None,
               fold: Callable[[], RecurrentState] | None) -> Committed:
        """Close the reply with the template suffix, fold it, and commit turn + state together.

        `fold()` returns the state after reading the prefix and exactly `tokens`; if it
        raises, the text is committed as error without a state (a replay rebuilds it).
        `fold=None` commits without a state on purpose (a server shutting down)."""
        writer = self.writer
        tok = writer.lm.tokenizer
        tokens = list(tokens)
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        tps = len(tokens) / elapsed if tokens else None
        suffix = writer.lm.template.reply_suffix(tok)
        ids = [*self.prefix, *tokens, *suffix]
        stats = {"new_tokens": len(tokens), "seconds": round(elapsed, 4), "tokens_per_s": tps, "stop_reason": stop_reason}
        after = blob = meta = None
        if fold is not None:
            try:
                _, after = writer.runner.prefill(suffix, fold())  # a runner's prefill runs without autograd itself
                blob, meta = writer._blob(after), writer._meta(after)
            except Exception as exc:  # no trustworthy state: commit the text, replay later
                after, error = None, error or f"{type(exc).__name__}: {exc}"
                status = "error"
        final = writer.store.turns.commit_turn(self.turn.id, content=tok.decode(tokens), status=status, token_ids=ids,
                                               stats=stats, error=error, state=blob, state_meta=meta)
        return Committed(final, after, tps)
