"""`ChatService`: the one facade that joins the runtime and the session store.

It opens, resumes and forks sessions, runs a turn as a stream of events, attaches
documents, and persists every turn with the state after it. The invariant it keeps: the
live state has read exactly the token ids stored for the branch up to the head, whatever
happens (stop, cancel, Ctrl-C, an exception mid-reply).

Turn layout in tokens (see `ChatTemplate`): the root system turn holds
`<|bos|><|system|>...<|end|>\\n`; a user turn `<|user|>...<|end|>\\n`; an assistant turn
`<|assistant|>` + the reply + `<|end|>\\n`, so the stored ids of a cancelled reply are the
partial reply closed by the template, and the state reads exactly those.

Thread use: the TUI calls streaming methods from a worker thread; one lock serializes them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from agent import timings
from agent.chat.browse import SessionBrowsing, guarded
from agent.chat.docs import fold_document, read_document
from agent.chat.options import SessionOptions
from agent.chat.recovery import fold_interrupted, rebuild
from agent.chat.replay import Progress, fold, load_state
from agent.chat.types import (
    ChatError,
    ChatEvent,
    ProbeAnswer,
    ProgressEvent,
    SessionView,
    StateCheck,
    StatsEvent,
    TokenEvent,
    TurnFinished,
    TurnStarted,
    TurnView,
)
from agent.chat.turns import ReplyWriter, TurnWriter, check_text
from agent.runtime.decoding import Generation, Runner
from agent.runtime.held import held_by_transcript_only, held_positions
from sessions import Session, SessionError, SessionStore, StateMeta

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.state import RecurrentState


class ChatService(SessionBrowsing):
    """See the module docstring. Construct it in the CLI; clients use `ChatServiceProtocol`.

    `options` are the values given at the edge (`-o KEY VALUE`, parsed by
    `agent.chat.options.parse_pairs`): a new session starts from them, and a resumed one
    keeps its stored options with these on top. The service is the one owner of the live
    `SessionOptions` and stores them, typed, whenever they change.

    How a turn is written (message, recall block, streaming reply, commit with its state)
    is `agent.chat.turns.TurnWriter`, shared with the server, so both leave the same rows."""

    def __init__(self, store: SessionStore, lm: LoadedModel, *, model_id: str, runner: Runner | None = None,
                 device: str = "cpu", options: Mapping[str, object] | None = None,
                 initial_state: RecurrentState | None = None, check: StateCheck | None = None) -> None:
        self.store = store
        self.lm = lm
        self.model_id = model_id
        self.runner = runner if runner is not None else _eager(lm)
        self.device = device
        self.given = dict(options or {})
        try:
            self.options = SessionOptions().with_values(self.given)
        except ValueError as exc:
            raise ChatError(str(exc)) from None
        self.writer = TurnWriter(store, lm, self.runner, model_id=model_id, initial_state=initial_state)
        self.refresher = self.writer.refresher
        self.check = check
        self._session: Session | None = None
        self._state: RecurrentState | None = None
        self._lease = None
        self._lock = threading.RLock()
        self._last_tps: float | None = None
        self.initial_state = initial_state
        self.fingerprint = self.writer.fingerprint  # covers a learned initial state too

    def fresh_state(self) -> RecurrentState:
        return self.writer.fresh_state()

    # ---- session lifecycle --------------------------------------------------------------

    @property
    def session(self) -> SessionView | None:
        return self._view(self._session) if self._session else None

    def _require(self) -> Session:
        if self._session is None:
            raise ChatError("no session is open; start one with /new or resume one")
        return self._session

    def _take(self, session: Session) -> None:
        """Become the writer of `session` (releasing the previous one)."""
        self._release()
        self._lease = self.writer.lease(session)
        self._session = session
        self._state = None

    def _release(self) -> None:
        if self._lease is not None:
            try:
                self._lease.release()
            except SessionError:
                pass
            self._lease = None

    def close(self) -> None:
        with self._lock:
            self._release()

    def _meta(self, state: RecurrentState) -> StateMeta:
        return self.writer._meta(state)

    def _blob(self, state: RecurrentState) -> bytes:
        return self.writer._blob(state)

    def new_session(self, *, system: str | None = None, name: str | None = None) -> SessionView:
        with self._lock:
            options = SessionOptions().with_values(self.given)  # not the last session's /set values
            session, state = self.writer.create(system=system if system is not None else "", name=name, options=options)
            self._take(session)
            self._state = state
            self.options = options
            return self._view(session)

    def resume(self, uid_prefix: str | None = None, *, progress: Progress | None = None) -> SessionView:
        """Load the stored state (no transcript replay). Turns stored after it (a message
        whose fold was interrupted) are folded with `progress` and stored, once. Raises
        StateUnusableError when the stored state cannot be trusted; the session stays
        selected so `rebuild_state` works."""
        with self._lock:
            try:
                session = self.store.core.get_session(uid_prefix) if uid_prefix else self.store.browse.most_recent_session()
            except SessionError as exc:
                raise ChatError(str(exc)) from None
            if session is None:
                raise ChatError("there is no session to continue yet; start one with `laplace chat`")
            self._take(session)
            self._adopt_options(session)
            self._state = self.writer.recover(session, progress=progress)  # fold an interrupted reply, check, load
            return self._view(self.store.core.get_session(session.id))

    def rebuild_state(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Replay the branch's stored token ids into a fresh state, with progress, and store it."""
        with self._lock:
            state = yield from rebuild(self, self._require(), cancel)
            if state is not None:
                self._state = state

    def _state_now(self) -> RecurrentState:
        if self._state is None:
            self._state = load_state(self, self._require())
        return self._state

    def transcript_only(self, turn_ids: Sequence[int]) -> set[int] | None:
        """Which of these turns the live state holds no token of exactly (see
        `agent.runtime.held`): only the transcript holds them now. None without a live state
        or for a mixer that holds no exact tokens. Cheap (one indexed read, a few
        comparisons per turn) and lock-free, since the TUI asks from its own thread while a
        reply streams (the answer may then lag the reply in flight; the TUI asks again after it)."""
        state, session = self._state, self._session
        if state is None or session is None:
            return None
        held = held_positions(state, self.lm.config)
        if held is None:
            return None
        return held_by_transcript_only(held, guarded(lambda: self.store.tree.spans(session.id, turn_ids)))

    # ---- turns --------------------------------------------------------------------------

    def send(self, text: str, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Store the user's message, fold it in, stream the reply, commit reply + state."""
        with self._lock:
            session = self._require()
            check_text(text, "message")
            state = self._state_now()
            with timings.phase("message: store it (recall refresh included)"):
                stored = self.writer.store_message(session, text, self.options.refresh)
            self._state = None  # stored but not yet read: stopped mid-fold, the next use loads (and folds) it
            timer = timings.phase(f"message: prefill {len(stored.recall_ids) + len(stored.user_ids)} tokens "
                                  f"({len(stored.recall_ids)} of recall)")
            with timer:
                if stored.recall_ids:
                    _, state = self.runner.prefill(stored.recall_ids, state)
                for done, state in fold(self.runner, stored.user_ids, state):
                    if len(stored.user_ids) > self.runner.segment_len:  # a long message: say how far the fold is
                        yield ProgressEvent("folding your message", done, len(stored.user_ids))
            self._state = state  # the user turn is stored; the live state has read it
            yield from self._reply(session, state, cancel, after=stored.user.id, user_turn=self._turn_view(stored.user),
                                   recall_turn=self._turn_view(stored.block) if stored.block is not None else None)

    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """A new sibling reply to the last user message; the old reply stays in history."""
        with self._lock:
            session = self._require()
            head = self.store.tree.get_turn(self.store.core.get_session(session.id).head_turn_id)
            if head.role != "assistant":
                raise ChatError("the last turn is not a reply; send a message first, then regenerate its reply")
            state = load_state(self, session, head.parent_id)
            self._state = state
            seed = self.options.sampling.seed
            if seed is not None:  # a fixed seed would regenerate the same reply: vary it per sibling
                seed += len(self.store.tree.siblings(head.id))
            yield from self._reply(session, state, cancel, after=head.parent_id, user_turn=None, regenerate_of=head.id,
                                   seed=seed)

    def switch_sibling(self, turn_id: int, step: int) -> TurnView:
        """Make the sibling `step` places from `turn_id` (wrapping) the current branch, down to
        its newest leaf. Every branch keeps its newest snapshot, so no replay is needed."""
        with self._lock:
            session = self._require()
            sibs = guarded(lambda: self.store.tree.siblings(turn_id))
            if len(sibs) < 2:
                raise ChatError("this turn has no other versions; regenerate a reply to make one")
            index = next(i for i, t in enumerate(sibs) if t.id == turn_id)
            target = sibs[(index + step) % len(sibs)]
            guarded(lambda: self.store.turns.set_head(session.id, target.id, descend=True))
            self._session = self.store.core.get_session(session.id)
            self._state = load_state(self, self._session)  # the branch's newest snapshot
            return self._turn_view(self.store.tree.get_turn(target.id))

    def _reply(self, session: Session, state: RecurrentState, cancel: threading.Event | None, *, after: int,
               user_turn: TurnView | None, regenerate_of: int | None = None, seed: int | None = None,
               recall_turn: TurnView | None = None) -> Iterator[ChatEvent]:
        """Stream the reply to the message stored as turn `after` (the token choice is
        `agent.runtime.reply.ReplySampler`, the server's too)."""
        tok, template = self.lm.tokenizer, self.lm.template
        reply = self.writer.begin_reply(session, self._lease, regenerate_of=regenerate_of)
        yield TurnStarted(user_turn, reply.turn.id, recall_turn)
        prefix = reply.prefix
        opts = self.options.sampling
        gen = None
        status, error = "complete", None
        try:
            tail = self.writer.prompt_tail(after, prefix)
            with timings.phase(f"reply: prefill its {len(prefix)}-token prefix"):
                logits, state = self.runner.prefill(prefix, state)
            gen = Generation(self.runner, state, logits, opts, stop_ids=template.stop_ids(tok), tokenizer=tok,
                             cancel=cancel, prompt_tail=tail,
                             generator=self.runner.new_generator(seed if regenerate_of is not None else opts.seed))
            for _ in gen:
                timings.mark("first token sampled")
                if gen.piece:
                    yield TokenEvent(gen.piece)
                reply.progress(gen.tokens)
            rest = gen.flush()
            if rest:
                yield TokenEvent(rest)
            if gen.stop_reason == "cancelled":
                status = "cancelled"
        except (KeyboardInterrupt, GeneratorExit):
            status = "cancelled"
            self._finish(reply, gen, state, status, None)
            raise
        except Exception as exc:  # the reply so far is kept, marked error
            status, error = "error", f"{type(exc).__name__}: {exc}"
        final = self._finish(reply, gen, state, status, error)
        if error is not None:
            yield TurnFinished(final)
            return
        yield StatsEvent(new_tokens=len(gen.tokens) if gen else 0, tokens_per_s=self._last_tps or 0.0,
                         tokens_folded=self._state.n_tokens, state_bytes=self._state.nbytes)
        yield TurnFinished(final)

    def _finish(self, reply: ReplyWriter, gen: Generation | None, state: RecurrentState,
                status: str, error: str | None) -> TurnView:
        """Close the reply with the template suffix, fold it, and commit turn + state together."""
        done = reply.commit(list(gen.tokens) if gen else [], status=status, error=error,
                            stop_reason=gen.stop_reason if gen else None,
                            fold=gen.finish if gen else lambda: self.runner.prefill(reply.prefix, state)[1])
        self._last_tps = done.tokens_per_s
        self._state = done.state
        self._session = self.store.core.get_session(reply.turn.session_id)
        return self._turn_view(done.turn)

    def attach(self, path: Path, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Fold a UTF-8 text file of any length into the state in fixed segments."""
        with self._lock:
            session = self._require()
            text = read_document(Path(path))
            before = self._state_now()
            turn = self._guard(lambda: self.store.turns.begin_turn(session.id, role="document", content=text))
            yield TurnStarted(None, turn.id)
            ids: list[int] = []
            state = before
            for event, state in fold_document(self.lm, self.runner, Path(path).name, text, before, ids, cancel):
                yield event
            if cancel is not None and cancel.is_set():  # nothing of it stays in the state
                final = self.store.turns.commit_turn(turn.id, status="cancelled", token_ids=[], error="attach cancelled",
                                               state=self._blob(before), state_meta=self._meta(before))
                self._state = before
            else:
                final = self.store.turns.commit_turn(turn.id, status="complete", token_ids=ids,
                                               state=self._blob(state), state_meta=self._meta(state))
                self._state = state
            yield TurnFinished(self._turn_view(final))

    def probe(self, question: str, expected: str | None = None, max_new_tokens: int = 48) -> ProbeAnswer:
        """Ask a copy of the live state; the live state and the transcript are untouched.

        With `expected`, the verdict is `laplace probe session`'s rule (`agent.recall.verdicts`):
        the answer ranked among same-shape distractors, against a blank-state control."""
        with self._lock:
            _check_text(question, "question")
            if expected is not None and not expected.strip():
                raise ChatError("the expected answer is empty; give the words the session should remember")
            if self.check is None:
                raise ChatError("this chat service was built without a recall check; use `laplace probe session`")
            check = self.check(self.lm, self._state_now().clone(), question, expect=expected,
                               answer_tokens=max_new_tokens)
            if expected is None:
                return ProbeAnswer(question, check.answer, None, None)
            return ProbeAnswer(question, check.answer, expected, check.verdict, check.reason)

    # ---- management ---------------------------------------------------------------------

    def fork(self, at_turn: int | None = None) -> SessionView:
        with self._lock:
            session = self._require()
            forked = self._guard(lambda: self.store.browse.fork(session.id, at_turn))
            self._take(forked)
            fold_interrupted(self, forked)
            self._state = load_state(self, forked)
            return self._view(forked)

    def rename(self, name: str) -> SessionView:
        with self._lock:
            self._session = self._guard(lambda: self.store.turns.rename_session(self._require().id, name.strip() or None))
            return self._view(self._session)

    def set_system(self, text: str) -> SessionView:
        """The state has already read the old system prompt and cannot un-read it, so a new
        system prompt starts a new session (the old one is kept)."""
        return self.new_session(system=text, name=None)

    def set_option(self, key: str, value: str) -> None:
        """`/set KEY VALUE`: parsed once, applied to the live options and stored typed."""
        with self._lock:
            try:
                self.options = self.options.with_text([(key, value)])
            except ValueError as exc:
                raise ChatError(str(exc)) from None
            if self._session is not None:
                self._session = self._guard(lambda: self.store.turns.set_options(self._session.id, self.options.stored()))

    def _adopt_options(self, session: Session) -> None:
        """A resumed session's stored options with the edge's on top; stored again when that
        changes them (or when an older database held them as text)."""
        self.options, self._session = self.writer.adopt_options(session, self.given)

    _guard = staticmethod(guarded)


def _eager(lm: LoadedModel) -> Runner:
    """The default runner: torch, eager (imported here: a caller that brings the torch-free
    engine's runner never loads torch)."""
    from agent.runtime.generation import EagerRunner

    return EagerRunner(lm.model)


_check_text = check_text  # the one refusal of text that cannot be stored, shared with the server