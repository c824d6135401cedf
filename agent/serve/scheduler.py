"""Continuous batching: one thread owns the model and advances every request together.

Each turn of the loop:

1. admit what arrived (`admission.py`, on this thread, so the store and the model have one
   user): bookkeeping only, never model work. Look the session up or create it, take its
   lease, load its newest snapshot, store the user's message (and a recall block) and begin
   the streaming reply row, as `ChatService` does, through the same `TurnWriter`; every id
   the state must still read (a new session's system prompt, turns stored after the
   snapshot, the message) becomes the row's prompt. A refusal goes back as an HTTP error;
2. move waiting rows into the batch while it has room (the largest width);
3. fold at most one segment's worth of prompt ids (`runner.prefill`, batch 1, so a compiled
   runner sees only its segment buckets), oldest request first: a long prompt is read a
   segment per turn, interleaved with decode steps, and never stalls the replies in flight;
4. pick one token for every decoding row (`agent.runtime.reply.ReplySampler`, chat's loop
   body: its own options, seeded generator and penalty history), end the rows that stop, and
   step the rest together, in place (`runner.step_`): their states stacked and padded with
   zero rows up to the next fixed width. Rows are independent in every op, so padding never
   changes a real row's tokens; the batch is rebuilt only when its rows change;
5. flush streaming text every 0.25 s and renew leases, in one transaction for all rows
   (`commits.py`, which also commits finished rows).

A client that goes away sets `cancel`. A decoding row then ends at the next step, its reply
kept and marked cancelled. A row whose prompt was not read yet keeps reading it (it leaves
its batch row to the others) and then commits the cancelled reply with the state after it,
so a cancel never leaves a turn that the next request would have to replay.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import sqlite3
import threading
import time
from typing import Callable, Mapping, Sequence

import torch

from agent.chat.options import SessionOptions
from agent.chat.taking import Recent
from agent.chat.turns import TurnWriter
from agent.chat.types import ChatError
from agent.runtime.state import RecurrentState
from agent.serve.admission import admit, api_error
from agent.serve.commits import Commits
from agent.serve.metrics import Metrics
from agent.serve.protocol import ApiError, ChatRequest, Limits
from agent.serve.rows import Event, Failed, Handle, Job, Row

DEFAULT_WIDTHS = (1, 2, 4, 8, 16)
IDLE_WAIT_S = 0.5
log = logging.getLogger("laplace.serve")


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down; try again in a moment", code="unavailable")


class Scheduler(Commits):
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
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False  # set (under the lock) before the inbox is drained for the last time
        self._pending = 0  # submitted, not yet in the batch (or cancelled before it got there)
        self._active = 0  # in the batch (prefilling or decoding, or cancelled while prefilling)
        self._busy: set[int] = set()  # session ids with a request in flight
        self._recent = Recent(max_states=self.max_rows)  # heads this server left, and their states
        self._waiting: collections.deque[Row] = collections.deque()
        self._prefilling: list[Row] = []
        self._draining: list[Row] = []  # cancelled before their prompt was read: reading it, then committed
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

    def stop(self, timeout: float = 30.0) -> bool:
        """Cancel what is in flight (replies kept, marked cancelled), release every lease.
        True once the loop has ended; False if it is still running after `timeout` (then
        its store must not be closed under it)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.alive

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, request: ChatRequest, handle: Handle) -> None:
        """Queue a request; 429 with Retry-After when too many already wait, 503 when stopping."""
        with self._lock:  # the same lock `_shutdown` closes under: a job is answered or refused, never lost
            if self._closed or self._stopping.is_set() or not self.alive:
                raise shutting_down()
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
                    busy = self._waiting or self._prefilling or self._draining or self._decoding
                    self._admit_arrivals(block=not busy)
                    self._activate()
                    self._prefill_some()
                    self._decode_step()
                    self._persist()
                    if self.on_step is not None:
                        self.on_step()
        except BaseException as exc:  # keep what killed the loop for /health; fail what waits
            self.error = exc
            log.error("the scheduler stopped on an error", exc_info=exc)
            self._shutdown()
            raise
        self._shutdown()

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
                row, admitted = admit(self.writer, job, given=self.given, busy=self._busy, limits=self.limits,
                                      recent=self._recent)
        except ChatError as exc:
            self._refuse(job, api_error(exc))
            return
        except ApiError as exc:
            self._refuse(job, exc)
            return
        self._busy.add(row.session_id)
        self._send(job.handle, admitted)
        self._waiting.append(row)

    def _start(self, row: Row) -> None:
        row.activated = time.monotonic()
        with self._lock:
            self._pending -= 1
            self._active += 1

    def _activate(self) -> None:
        for row in [r for r in self._waiting if r.cancelled]:  # gone while waiting: read its prompt anyway
            self._waiting.remove(row)
            self._draining.append(row)  # still counted as waiting: clients that leave cannot flood the loop
        while self._waiting and len(self._prefilling) + len(self._decoding) < self.max_rows:
            row = self._waiting.popleft()
            self._start(row)
            self._prefilling.append(row)

    def _prefill_some(self) -> None:
        """Fold up to one segment of prompt ids, oldest request first."""
        budget = self.runner.segment_len
        for row in sorted([*self._prefilling, *self._draining], key=lambda r: r.job.submitted):
            if budget <= 0:
                break
            if row.cancelled and row in self._prefilling:  # its batch row goes to the others
                self._prefilling.remove(row)
                self._draining.append(row)
            take = min(budget, len(row.prompt) - row.done)
            if row.marks and row.marks[0][0] > row.done:  # stop at a turn whose state is stored
                take = min(take, row.marks[0][0] - row.done)
            t0 = time.perf_counter()
            try:
                logits, row.state = self.runner.prefill(row.prompt[row.done:row.done + take], row.state)
            except Exception as exc:  # the message is stored; the reply is kept as error, unread
                with self._writes():
                    self._finish(row, "error", error=f"{type(exc).__name__}: {exc}", fold=False)
                continue
            self.metrics.prefill(take, time.perf_counter() - t0)
            row.done += take
            row.read += take
            budget -= take
            if row.marks and row.marks[0][0] == row.done:
                self._store_state(row, row.marks.pop(0)[1])
            if row.done == len(row.prompt):
                row.logits = logits
                if row in self._draining:  # read to the end: commit the cancelled reply with its state
                    with self._writes():
                        self._finish(row, "cancelled")
                else:
                    self._prefilling.remove(row)
                    self._decoding.append(row)

    def _decode_step(self) -> None:
        going: list[Row] = []
        ending: list[tuple[Row, str, str | None]] = []
        for row in self._decoding:
            if row.cancelled:
                ending.append((row, "cancelled", None))
                continue
            try:
                ended = self._sample(row)
            except Exception as exc:
                ending.append((row, "error", f"{type(exc).__name__}: {exc}"))
                continue
            if ended is None:
                going.append(row)
            else:
                ending.append((row, "complete", None))
        if ending:  # before the batch is rebuilt: a finishing row's state is read out of it
            with self._writes():
                for row, status, error in ending:
                    self._finish(row, status, error=error)
        self._decoding = going
        if not going:
            self._batch, self._batch_rows = None, []
            return
        n = len(going)
        width = next(w for w in self.widths if w >= n)
        if going != self._batch_rows or self._batch is None or self._batch.batch_size != width:
            self._rebuild(going, width)
        assert self._batch is not None
        tokens = torch.zeros(width, dtype=torch.long, device=self.runner.device)
        tokens[:n] = torch.tensor([r.pending for r in going], dtype=torch.long)
        t0 = time.perf_counter()
        try:
            logits = self.runner.step_(tokens, self._batch)  # in place: no copy of the batch per token
        except Exception as exc:  # every row in the step ends as error; the server goes on
            error = f"{type(exc).__name__}: {exc}"
            with self._writes():  # the batch may be half-written: no state is stored from it
                for row in going:
                    self._finish(row, "error", error=error, fold=False)
            self._decoding, self._batch, self._batch_rows = [], None, []
            return
        self.metrics.step(n, width, time.perf_counter() - t0)
        for i, row in enumerate(going):
            row.logits = logits[i:i + 1]
            row.pending = None
            row.read += 1

    def _sample(self, row: Row) -> str | None:
        """Pick the row's next token; returns why it ended (stop_reason) or None to go on."""
        token = row.sampler.pick(row.logits)
        if row.first_token is None:
            row.first_token = time.monotonic()
        if token is not None:
            row.pending = token
            row.deliver(row.sampler.piece, final=False)
        return row.sampler.stop_reason

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

    # ---- stopping -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Stop everything in flight: replies kept and marked cancelled, leases released.
        A store that fails now (closed, disk gone) is logged: the next server's lease
        takeover marks those replies cancelled. Anything else is a bug: logged and raised.
        Either way every request still waiting is answered."""
        with self._lock:
            self._closed = True  # from here `submit` refuses: nothing lands in the inbox unanswered
        try:
            with self._writes():
                self._cancel_all()
        except sqlite3.Error:
            log.exception("the session store failed while stopping; the next server marks these replies cancelled")
        except BaseException:
            log.exception("stopping the scheduler failed")
            raise
        finally:
            self._abandon()

    def _cancel_all(self) -> None:
        for row in [*self._decoding]:
            row.job.handle.cancel.set()
            self._finish(row, "cancelled")
        for row in [*self._prefilling, *self._draining, *self._waiting]:
            row.job.handle.cancel.set()
            self._finish(row, "cancelled", fold=False)
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._refuse(job, shutting_down())
        self._batch, self._batch_rows = None, []

    def _abandon(self) -> None:
        """Answer whatever `_cancel_all` could not get to (it failed part-way): 503, nothing written."""
        rows = [*self._decoding, *self._prefilling, *self._draining, *self._waiting]
        self._decoding, self._prefilling, self._draining, self._waiting = [], [], [], collections.deque()
        for row in rows:
            row.job.handle.put(Failed(shutting_down()))
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            job.handle.put(Failed(shutting_down()))
