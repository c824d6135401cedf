"""One request inside the scheduler: its prompt, sampling, text and the events it sends out.

A `Row` lives on the scheduler thread. The HTTP side sees it only through its `Handle`,
which receives `Admitted`, `Delta` and then `Finished` (or a single `Failed`) from that
thread, safely, on the event loop that made it.

Stop strings follow OpenAI: the reply a client sees ends before the stop string, and text
that could still turn out to start one is held back until it cannot. The stored turn keeps
what the model wrote, as `laplace chat` stores it (the state has read those tokens). The
tokens themselves are chosen by `agent.runtime.reply.ReplySampler`, chat's loop body.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agent.serve.protocol import ApiError, ChatRequest


@dataclass(frozen=True)
class Admitted:
    session: str
    user_turn_id: int
    assistant_turn_id: int
    recall: dict[str, Any] | None
    created_session: bool


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Finished:
    status: str  # complete | cancelled | error
    finish_reason: str | None  # stop | length (OpenAI's words); None when cancelled or failed
    text: str  # what the client was sent, all of it
    prompt_tokens: int
    completion_tokens: int
    tokens_folded: int
    error: str | None
    timings: dict[str, float | None]


@dataclass(frozen=True)
class Failed:
    error: ApiError


Event = Admitted | Delta | Finished | Failed


class Handle:
    """The HTTP side's end of a request: events arrive on its loop; `cancel` goes the other way."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.cancel = threading.Event()
        self.finished = False

    def put(self, event: Event) -> None:
        """Called from the scheduler thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> Event:
        event = await self.queue.get()
        if isinstance(event, (Finished, Failed)):
            self.finished = True
        return event


@dataclass
class Job:
    request: ChatRequest
    handle: Handle
    submitted: float = field(default_factory=time.monotonic)


@dataclass(eq=False)  # rows compare by identity: `row in rows` must never compare tensors
class Row:
    """A request the scheduler has admitted: stored message, begun reply, state to advance."""

    job: Job
    session_id: int
    session_uid: str
    lease: Any  # sessions.Lease, through agent.chat.turns
    reply: Any  # agent.chat.turns.ReplyWriter
    prompt: list[int]  # ids to fold before the first sample: owed turns, history, recall, message, reply prefix
    state: Any  # RecurrentState, batch 1, while prefilling; None while its row lives in the batch
    sampler: Any  # agent.runtime.reply.ReplySampler: the token choice, as `laplace chat` makes it
    prompt_tokens: int
    read: int  # tokens the row's state has read
    done: int = 0  # prompt ids folded so far
    marks: list[tuple[int, int]] = field(default_factory=list)  # (prompt offset, turn id): store the state there
    logits: Any = None  # [1, vocab]: what the next token is sampled from
    pending: int | None = None  # sampled and kept, not yet read by the state
    slot: int | None = None  # row index in the decode batch
    sent: int = 0  # characters of the reply's text dealt with (sent, or dropped after a stop string)
    unsent: str = ""  # text after `sent` not yet sent (at most what could begin a stop string, and the last piece)
    shown: list[str] = field(default_factory=list)  # what the client was sent
    activated: float | None = None
    first_token: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.job.handle.cancel.is_set()

    @property
    def tokens(self) -> list[int]:
        return self.sampler.tokens

    def deliver(self, piece: str, *, final: bool) -> None:
        """Send what is safe of the reply's new text `piece`: everything before a stop
        string, and nothing that could still turn out to begin one (unless `final`).
        O(len(piece) + held back) per call, whatever the reply's length."""
        self.unsent += piece
        stop_at = self.sampler.stop_at
        if stop_at is not None:
            safe = max(0, stop_at - self.sent)
        elif final:
            safe = len(self.unsent)
        else:
            safe = len(self.unsent) - self.sampler.held
        if safe > 0:
            out = self.unsent[:safe]
            self.job.handle.put(Delta(out))
            self.shown.append(out)
            self.sent += safe
            self.unsent = self.unsent[safe:]
        if stop_at is not None:  # nothing after a stop string is sent
            self.sent += len(self.unsent)
            self.unsent = ""

    def timings(self, now: float) -> dict[str, float | None]:
        t0 = self.job.submitted

        def since(t: float | None) -> float | None:
            return round(t - t0, 6) if t is not None else None

        return {"queue_s": since(self.activated), "first_token_s": since(self.first_token), "total_s": round(now - t0, 6)}
