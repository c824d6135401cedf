"""Continuous batching: one thread owns the model and advances every request together.

Each turn of the loop:

1. admit what arrived (`admission.py`, on this thread, so the store and the model have one
   user): look the session up or create it, take its lease, load its state, store the
   user's message (and a recall block) and begin the streaming reply row, exactly as
   `ChatService` does, through the same `agent.chat.turns.TurnWriter`; a refusal goes back
   as an HTTP error;
2. move waiting rows into the batch while it has room (the largest width);
3. fold at most one segment's worth of prompt ids (`runner.prefill`, batch 1, so a compiled
   runner sees only its segment buckets): a long prompt is read a segment per turn,
   interleaved with decode steps, and never stalls the replies in flight;
4. sample one token for every decoding row (its own options and seeded generator), end
   the rows that stop, and step the rest together: their states stacked and padded with
   zero rows up to the next fixed width. Rows are independent in every op, so padding
   never changes a real row's tokens; the batch is rebuilt only when its rows change;
5. flush streaming text every 0.25 s and renew leases, in one transaction for all rows.

Store writes are grouped per loop turn (`_writes`): the turn's admissions in one
transaction, its finished rows in another, each request in its own savepoint (all of its
rows land, or none), so a batch pays one fsync instead of one per row. The events that
report them (admitted, finished) go out only after that transaction has committed.

A finished row commits its turn with the state after it (`ReplyWriter.commit`), releases
its lease, and the client gets `Finished`. A client that goes away sets `cancel`: the row
ends at the next step, its reply kept and marked cancelled.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Sequence

import torch

from agent.chat.options import SessionOptions
from agent.chat.turns import FLUSH_EVERY_S, HEARTBEAT_EVERY_S, TurnWriter
from agent.chat.types import ChatError
from agent.runtime.generation import draw
from agent.runtime.sampling import sample
from agent.runtime.state import RecurrentState
from agent.serve.admission import admit, api_error, release
from agent.serve.metrics import Metrics
from agent.serve.protocol import ApiError, ChatRequest, Limits
from agent.serve.rows import Event, Failed, Finished, Handle, Job, Row

DEFAULT_WIDTHS = (1, 2, 4, 8, 16)
IDLE_WAIT_S = 0.5


class Scheduler:
    """See the module docstring. `submit` from any thread; everything else runs on its own."""

    def __init__(self, writer: TurnWriter, *, widths: Sequence[int] = DEFAULT_WIDTHS,
                 options: Mapping[str, object] | None = None, limits: Limits = Limits(),
                 on_step: Callable[[], None] | None = None) -> None:
        widths = tuple(sorted(set(widths)))
        if not widths or widths[0] < 1:
            raise ValueError(f"batch widths must be positive integers, got {widths}")
        self.writer = writer
        self.runner = writer.runner
        self.widths = widths
        self.max_rows = widths[-1]
        self.given = dict(options or {})
        SessionOptions().with_values(self.given)  # refuse bad server-wide options at start
        self.limits = limits
        self.metrics = Metrics()
        self.on_step = on_step  # tests: a hook between loop turns
        tok = writer.lm.tokenizer
        self.stop_ids = set(writer.lm.template.stop_ids(tok))
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not yet in the batch
        self._active = 0  # in the batch (prefilling or decoding)
        self._busy: set[int] = set()  # session ids with a request in flight
        self._waiting: collections.deque[Row] = collections.deque()
        self._prefilling: list[Row] = []
        self._decoding: list[Row] = []
        self._batch: RecurrentState | None = None
        self._batch_rows: list[Row] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_persist = 0.0
        self._held: list[tuple[Handle, Event]] | None = None  # events waiting for their transaction
        self.error: BaseException | None = None  # what killed the loop, if anything did

    # ---- the HTTP side --------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="laplace-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what is in flight (replies kept, marked cancelled), release every lease."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, request: ChatRequest, handle: Handle) -> None:
        """Queue a request; 429 with Retry-After when too many already wait, 503 when stopping."""
        if self._stopping.is_set() or not self.alive:
            raise ApiError(503, "the server is shutting down; try again in a moment", code="unavailable")
        with self._lock:
            waiting = self._pending - max(0, self.max_rows - self._active)
            if waiting >= self.limits.max_queue:
                retry = self._retry_after(waiting)
                raise ApiError(429, f"{waiting} requests are already waiting (the limit is {self.limits.max_queue}); "
                                    f"retry in {retry} s", code="queue_full", headers={"Retry-After": str(retry)})
            self._pending += 1
        self._inbox.put(Job(request, handle))

    def _retry_after(self, waiting: int) -> int:
        turn_s = self.metrics.mean_turn_seconds() or 1.0
        return int(min(60, max(1, math.ceil(turn_s * (waiting + 1) / self.max_rows))))

    def load(self) -> dict[str, int]:
        with self._lock:
            return {"active": self._active, "pending": self._pending, "max_rows": self.max_rows}

    # ---- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    self._admit_arrivals(block=not (self._waiting or self._prefilling or self._decoding))
                    self._activate()
                    self._prefill_some()
                    self._decode_step()
                    self._persist()
                    if self.on_step is not None:
                        self.on_step()
                self._shutdown()
        except BaseException as exc:  # keep what killed the loop for /health; fail what waits
            self.error = exc
            self._shutdown()
            raise

    @contextmanager
    def _writes(self) -> Iterator[None]:
        """One transaction for the store writes inside; the events they produced are sent
        once it commits (a client never hears of a turn that is not durable yet)."""
        if self._held is not None:  # already inside one
            yield
            return
        self._held = []
        try:
            with self.writer.store.core.transaction():
                yield
        except BaseException as exc:
            held, self._held = self._held, None
            for handle, _ in held:  # nothing of theirs was stored after all
                handle.put(Failed(ApiError(500, f"the session store failed ({type(exc).__name__}: {exc})",
                                           code="store_error")))
            raise
        held, self._held = self._held, None
        for handle, event in held:
            handle.put(event)

    def _send(self, handle: Handle, event: Event) -> None:
        if self._held is not None:
            self._held.append((handle, event))
        else:
            handle.put(event)

    def _admit_arrivals(self, *, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            self._persist()
            return
        jobs = [job]
        while True:
            try:
                jobs.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        with self._writes():
            for job in jobs:
                self._admit(job)

    def _refuse(self, job: Job, error: ApiError) -> None:
        with self._lock:
            self._pending -= 1
        self.metrics.refused(error.status)
        self._send(job.handle, Failed(error))

    def _admit(self, job: Job) -> None:
        if job.handle.cancel.is_set():  # gone before we got to it: nothing was stored
            self._refuse(job, ApiError(499, "the client went away"))
            return
        try:
            with self.writer.store.core.transaction():  # a savepoint: all of this request's rows, or none
                row, admitted = admit(self.writer, job, given=self.given, busy=self._busy, limits=self.limits)
        except ChatError as exc:
            self._refuse(job, api_error(exc))
            return
        except ApiError as exc:
            self._refuse(job, exc)
            return
        self._busy.add(row.session_id)
        self._send(job.handle, admitted)
        self._waiting.append(row)

    def _activate(self) -> None:
        gone = [r for r in self._waiting if r.cancelled]  # gone while waiting: nothing was read
        if gone:
            with self._writes():
                for row in gone:
                    self._waiting.remove(row)
                    self._finish(row, "cancelled", None)
        while self._waiting and len(self._prefilling) + len(self._decoding) < self.max_rows:
            row = self._waiting.popleft()
            row.activated = time.monotonic()
            self._prefilling.append(row)
            with self._lock:
                self._pending -= 1
                self._active += 1

    def _prefill_some(self) -> None:
        """Fold up to one segment of prompt ids, oldest request first."""
        budget = self.runner.segment_len
        for row in list(self._prefilling):
            if budget <= 0:
                break
            if row.cancelled:
                with self._writes():
                    self._finish(row, "cancelled", None)
                continue
            take = min(budget, len(row.prompt) - row.done)
            t0 = time.perf_counter()
            try:
                logits, row.state = self.runner.prefill(row.prompt[row.done:row.done + take], row.state)
            except Exception as exc:  # the message is stored; the reply is kept as error, unread
                with self._writes():
                    self._finish(row, "error", None, error=f"{type(exc).__name__}: {exc}", fold=False)
                continue
            self.metrics.prefill(take, time.perf_counter() - t0)
            row.done += take
            row.read += take
            budget -= take
            if row.done == len(row.prompt):
                row.logits = logits
                self._prefilling.remove(row)
                self._decoding.append(row)

    def _decode_step(self) -> None:
        going: list[Row] = []
        ending: list[tuple[Row, str, str | None, str | None]] = []
        for row in self._decoding:
            if row.cancelled:
                ending.append((row, "cancelled", None, None))
                continue
            try:
                ended = self._sample(row)
            except Exception as exc:
                ending.append((row, "error", None, f"{type(exc).__name__}: {exc}"))
                continue
            if ended is None:
                going.append(row)
            else:
                ending.append((row, "complete", ended, None))
        if ending:  # before the batch is rebuilt: a finishing row's state is read out of it
            with self._writes():
                for row, status, reason, error in ending:
                    self._finish(row, status, reason, error=error)
        self._decoding = going
        if not going:
            self._batch, self._batch_rows = None, []
            return
        n = len(going)
        width = next(w for w in self.widths if w >= n)
        if going != self._batch_rows or self._batch is None or self._batch.batch_size != width:
            self._rebuild(going, width)
        tokens = torch.zeros(width, dtype=torch.long, device=self.runner.device)
        tokens[:n] = torch.tensor([r.pending for r in going], dtype=torch.long)
        t0 = time.perf_counter()
        try:
            logits, self._batch = self.runner.step(tokens, self._batch)
        except Exception as exc:  # every row in the step ends as error; the server goes on
            error = f"{type(exc).__name__}: {exc}"
            with self._writes():
                for row in going:
                    self._finish(row, "error", None, error=error)
            self._decoding, self._batch, self._batch_rows = [], None, []
            return
        self.metrics.step(n, width, time.perf_counter() - t0)
        for i, row in enumerate(going):
            row.logits = logits[i:i + 1]
            row.pending = None
            row.read += 1

    def _sample(self, row: Row) -> str | None:
        """Draw the row's next token; returns why it ended (stop_reason) or None to go on."""
        opts = row.opts
        hist = row.tokens[-256:]
        hist_t = torch.tensor([hist], dtype=torch.long, device=row.logits.device) \
            if hist and opts.repetition_penalty != 1.0 else None
        token = int(sample(row.logits, row.generator, **draw(opts), history=hist_t)[0])
        if row.first_token is None:
            row.first_token = time.monotonic()
        if token in self.stop_ids:
            return "stop"
        row.tokens.append(token)
        row.pending = token
        if row.push_text(row.decoder.push(token), final=False):
            return "stop_string"
        if len(row.tokens) >= opts.max_new_tokens:
            return "length"
        return None

    def _rebuild(self, rows: list[Row], width: int) -> None:
        """The decode batch for `rows`: rows already in it are copied out, new ones join."""
        states = []
        for row in rows:
            states.append(self._batch.select(row.slot) if row.slot is not None and self._batch is not None else row.state)
        self._batch = RecurrentState.stack(states).padded_to(width)
        for i, row in enumerate(rows):
            row.slot, row.state = i, None
        self._batch_rows = list(rows)
        self.metrics.rebuild()

    def _row_state(self, row: Row) -> RecurrentState:
        """The row's own state as batch 1 (a copy out of the batch when it lives there)."""
        state = self._batch.select(row.slot) if row.slot is not None and self._batch is not None else row.state
        state.n_tokens = row.read
        return state

    def _finish(self, row: Row, status: str, stop_reason: str | None, *, error: str | None = None,
                fold: bool = True) -> None:
        """Commit the row's turn with the state after it, release it, tell the client."""
        if row.done < len(row.prompt):
            # Cancelled or failed before its prompt was read: the turn is committed without a
            # state, and the next request on the session replays it from the last snapshot.
            fold = False
        rest = row.decoder.flush()
        if status != "cancelled":
            row.push_text(rest, final=True)
        else:
            row.text += rest

        def folded() -> RecurrentState:
            state = self._row_state(row)
            if row.pending is not None:
                _, state = self.runner.prefill([row.pending], state)
            return state

        if status == "cancelled":
            stop_reason = "cancelled"
        try:
            done = row.reply.commit(row.tokens, status=status, error=error, stop_reason=stop_reason,
                                    fold=folded if fold else None)
            final_status, final_error = done.turn.status, done.turn.error
            folded_tokens = done.state.n_tokens if done.state is not None else done.turn.tokens_total
        except Exception as exc:  # the commit itself failed (lease lost, disk full): say so
            final_status, final_error, folded_tokens = "error", f"{type(exc).__name__}: {exc}", row.read
        release(row.lease)
        self._busy.discard(row.session_id)
        if row in self._prefilling:
            self._prefilling.remove(row)
        with self._lock:
            if row.activated is not None:
                self._active -= 1
            else:
                self._pending -= 1
        now = time.monotonic()
        reason = {"stop": "stop", "stop_string": "stop", "length": "length"}.get(stop_reason or "")
        timings = row.timings(now)
        self.metrics.finished(final_status, len(row.tokens), timings)
        self._send(row.job.handle, Finished(final_status, reason if final_status == "complete" else None, row.shown,
                                            row.prompt_tokens, len(row.tokens), folded_tokens, final_error, timings))

    def _persist(self) -> None:
        """Flush due streaming text and renew due leases, one transaction for all rows."""
        now = time.monotonic()
        if now - self._last_persist < FLUSH_EVERY_S / 2:
            return
        self._last_persist = now
        streaming = {id(r) for r in self._decoding if r.tokens}
        rows = [*self._decoding, *self._prefilling, *self._waiting]
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
                    self._drop(row)
                    self._finish(row, "error", None, error=error)

    def _drop(self, row: Row) -> None:
        for group in (self._decoding, self._prefilling):
            if row in group:
                group.remove(row)
        if row in self._waiting:
            self._waiting.remove(row)

    def _shutdown(self) -> None:
        """Stop everything in flight: replies kept and marked cancelled, leases released."""
        try:
            with self._writes():
                self._cancel_all()
        except Exception:  # the store is gone: the next server's lease takeover marks them cancelled
            pass

    def _cancel_all(self) -> None:
        for row in [*self._decoding]:
            row.job.handle.cancel.set()
            self._finish(row, "cancelled", None)
        self._decoding = []
        for row in [*self._prefilling, *self._waiting]:
            row.job.handle.cancel.set()
            self._finish(row, "cancelled", None, fold=False)
        self._prefilling, self._waiting = [], collections.deque()
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._refuse(job, ApiError(503, "the server is shutting down; try again in a moment", code="unavailable"))
        self._batch, self._batch_rows = None, []
