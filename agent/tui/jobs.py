"""Streaming jobs: a service iterator (send, regenerate, attach, rebuild) consumed in a worker
thread, its events posted back to the UI as messages.

The worker never touches widgets. It calls the iterator factory in the thread (so even the
service's setup work is off the UI loop), posts each event stamped with the time it was
posted, turns a `ChatError` into an `ErrorEvent`, and always posts `JobEnded` and sets
`Job.done`, which lets quitting wait briefly for the service to store a cancelled reply.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal

from textual.message import Message
from textual.message_pump import MessagePump

from agent.chat.types import ChatError, ChatEvent, ErrorEvent

JobKind = Literal["send", "regenerate", "attach", "rebuild"]
StreamFactory = Callable[[threading.Event], Iterator[ChatEvent]]


@dataclass
class Job:
    id: int
    kind: JobKind
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    saw_finish: bool = False
    failed: bool = False


class JobEvent(Message):
    """One event from a running job."""

    def __init__(self, job_id: int, event: ChatEvent, posted_at: float) -> None:
        super().__init__()
        self.job_id = job_id
        self.event = event
        self.posted_at = posted_at


class JobEnded(Message):
    """The job's iterator is exhausted (or raised)."""

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id


def consume(target: MessagePump, job: Job, factory: StreamFactory) -> None:
    """Run in a worker thread: drain the iterator, posting everything to `target`."""
    try:
        for event in factory(job.cancel):
            target.post_message(JobEvent(job.id, event, time.perf_counter()))
    except ChatError as e:
        target.post_message(JobEvent(job.id, ErrorEvent(str(e)), time.perf_counter()))
    except Exception as e:  # noqa: BLE001 - a bug in the service must not kill the UI silently
        target.post_message(JobEvent(job.id, ErrorEvent(f"internal error: {e!r}"), time.perf_counter()))
    finally:
        job.done.set()
        target.post_message(JobEnded(job.id))
