"""The scheduler's store writes: grouped transactions, a finished row's commit, flushes.

Store writes are grouped per loop turn (`_writes`): the turn's admissions in one
transaction, its finished rows in another, each request in its own savepoint (all of its
rows land, or none), so a batch pays one fsync instead of one per row. The events that
report them (admitted, finished) go out only after that transaction has committed: a
client never hears of a turn that is not durable yet.

A finished row commits its turn with the state after it (`ReplyWriter.commit`), releases
its lease, and the client gets `Finished`. Only a row stopped with the server, or failed,
before its prompt was read commits without a state (the next request on the session then
reads the owed turns through the segmented prefill, like any prompt).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
import threading
from typing import Any, Iterator

from agent.chat.taking import release
from agent.chat.turns import FLUSH_EVERY_S, HEARTBEAT_EVERY_S
from agent.runtime.state import RecurrentState
from agent.serve.protocol import ApiError
from agent.serve.rows import Event, Failed, Finished, Handle, Row

log = logging.getLogger("laplace.serve")
FINISH_REASONS = {"stop": "stop", "stop_string": "stop", "length": "length"}  # ours -> OpenAI's


class Commits:
    """Mixed into `Scheduler`: everything it writes to the store, on its own thread. What it
    uses of the scheduler is declared here (this module must not import that one)."""

    writer: Any  # agent.chat.turns.TurnWriter
    runner: Any
    metrics: Any  # agent.serve.metrics.Metrics
    _lock: threading.Lock
    _held: list[tuple[Handle, Event]] | None
    _batch: RecurrentState | None
    _busy: set[int]
    _recent: Any  # agent.chat.taking.Recent
    _waiting: Any  # deque[Row]
    _prefilling: list[Row]
    _draining: list[Row]
    _decoding: list[Row]
    _last_persist: float
    _active: int
    _pending: int

    @contextmanager
    def _writes(self) -> Iterator[None]:
        """One transaction for the store writes inside; their events are sent once it commits."""
        if self._held is not None:  # already inside one
            yield
            return
        self._held = []
        try:
            with self.writer.store.core.transaction():
                yield
        except BaseException:
            held, self._held = self._held, None
            log.exception("a store transaction failed; %d request(s) told so", len(held))
            for handle, _ in held:  # nothing of theirs was stored after all
                handle.put(Failed(ApiError(500, "the session store failed; nothing of this request was stored "
                                                "(the server's log says why)", code="store_error")))
            raise
        held, self._held = self._held, None
        for handle, event in held:
            handle.put(event)

    def _send(self, handle: Handle, event: Event) -> None:
        if self._held is not None:
            self._held.append((handle, event))
        else:
            handle.put(event)

    def _store_state(self, row: Row, turn_id: int) -> None:
        """Store the row's state (batch 1, while it reads its prompt) as turn `turn_id`'s.
        A cache like any snapshot: if it cannot be written, the turn is replayed later."""
        state = row.state
        state.n_tokens = row.read
        try:
            with self._writes():
                self.writer.store.states.put(turn_id, self.writer._blob(state), self.writer._meta(state))
        except Exception:
            log.exception("storing the state of turn %d of session %s failed", turn_id, row.session_uid[:8])

    def _row_state(self, row: Row) -> RecurrentState:
        """The row's own state as batch 1 (a copy out of the batch when it lives there)."""
        state = self._batch.select(row.slot) if row.slot is not None and self._batch is not None else row.state
        state.n_tokens = row.read
        return state

    def _finish(self, row: Row, status: str, *, error: str | None = None, fold: bool = True) -> None:
        """Commit the row's turn with the state after it, release it, tell the client."""
        if row.done < len(row.prompt):  # stopped or failed before its prompt was read: no state to store
            fold = False
        if error is not None:
            log.error("reply %d of session %s ended with an error: %s", row.reply.turn.id, row.session_uid[:8], error)
        rest = row.sampler.flush()
        if status != "cancelled":
            row.deliver(rest, final=True)

        def folded() -> RecurrentState:
            state = self._row_state(row)
            if row.pending is not None:
                _, state = self.runner.prefill([row.pending], state)
            return state

        stop_reason = "cancelled" if status == "cancelled" else row.sampler.stop_reason
        try:
            done = row.reply.commit(row.tokens, status=status, error=error, stop_reason=stop_reason,
                                    fold=folded if fold else None)
            final_status, final_error = done.turn.status, done.turn.error
            folded_tokens = done.state.n_tokens if done.state is not None else done.turn.tokens_total
            self._recent.left(row.session_id, done.turn.id, done.state)  # our chain, our state: no need to reread
        except Exception as exc:  # the commit itself failed (lease lost, disk full): say so
            log.exception("committing reply %d of session %s failed", row.reply.turn.id, row.session_uid[:8])
            final_status, final_error, folded_tokens = "error", f"{type(exc).__name__}: {exc}", row.read
        release(row.lease)
        self._busy.discard(row.session_id)
        self._drop(row)
        with self._lock:
            if row.activated is not None:
                self._active -= 1
            else:
                self._pending -= 1
        now = time.monotonic()
        reason = FINISH_REASONS.get(stop_reason or "")
        timings = row.timings(now)
        self.metrics.finished(final_status, len(row.tokens), timings)
        self._send(row.job.handle, Finished(final_status, reason if final_status == "complete" else None,
                                            "".join(row.shown), row.prompt_tokens, len(row.tokens), folded_tokens,
                                            final_error, timings))

    def _drop(self, row: Row) -> None:
        for group in (self._decoding, self._prefilling, self._draining):
            if row in group:
                group.remove(row)
        if row in self._waiting:
            self._waiting.remove(row)

    def _persist(self) -> None:
        """Flush due streaming text and renew due leases, one transaction for all rows."""
        now = time.monotonic()
        if now - self._last_persist < FLUSH_EVERY_S / 2:
            return
        self._last_persist = now
        streaming = {id(r) for r in self._decoding if r.tokens}
        rows = [*self._decoding, *self._prefilling, *self._draining, *self._waiting]
        due = [r for r in rows if (id(r) in streaming and now - r.reply.last_flush > FLUSH_EVERY_S)
               or now - r.reply.last_beat > HEARTBEAT_EVERY_S]
        if not due:
            return
        failed = []
        with self._writes():
            for row in due:
                try:
                    if id(row) in streaming:
                        row.reply.progress(row.tokens, now)
                    else:
                        row.reply.heartbeat(now)
                except Exception as exc:  # the lease was taken over: this row cannot be written
                    failed.append((row, f"{type(exc).__name__}: {exc}"))
        if failed:
            with self._writes():
                for row, error in failed:
                    self._finish(row, "error", error=error)
