"""The vocabulary shared by the chat service and its clients (TUI, `laplace ask`).

Plain dataclasses, no torch and no SQL, so the TUI can import them (and tests can build a
fake service) without pulling in the runtime. `ChatService` in `agent/chat/service.py` is the real
implementation of `ChatServiceProtocol`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal, Protocol, Sequence, Union

# The recall verdict words, re-exported for the TUI from the one rule that produces them
# (plain Python, no torch).
from agent.recall.verdicts import FORGOTTEN as FORGOTTEN, REMEMBERED as REMEMBERED, WEAK as WEAK

if TYPE_CHECKING:  # annotations only: this module stays free of torch
    from agent.runtime.checkpoint import LoadedModel
    from agent.runtime.state import RecurrentState

TurnStatus = Literal["streaming", "complete", "cancelled", "error"]


@dataclass(frozen=True)
class TurnView:
    id: int
    role: str  # system | user | assistant | document
    content: str
    status: TurnStatus
    parent_id: int | None = None
    n_tokens: int = 0
    sibling_index: int = 0  # position among its siblings (edits / regenerations)
    sibling_count: int = 1
    kind: str = ""  # "recall": a recall block (a document turn the service added itself)
    used_recall: bool = False  # a reply written right after a recall block


@dataclass(frozen=True)
class SessionView:
    uid: str
    name: str
    model: str
    system_prompt: str
    turns: int
    tokens_folded: int
    state_bytes: int
    updated_at: str
    archived: bool = False


@dataclass(frozen=True)
class StatusView:
    """What the status bar shows."""

    model: str
    device: str
    session_uid: str | None
    session_name: str
    tokens_folded: int
    state_bytes: int
    kv_cache_bytes: int  # a comparable softmax model's KV cache for the same history
    last_tokens_per_s: float | None = None


@dataclass(frozen=True)
class SearchHit:
    session_uid: str
    session_name: str
    turn_id: int
    role: str
    snippet: str


@dataclass(frozen=True)
class ProbeAnswer:
    question: str
    answer: str
    expected: str | None
    verdict: str | None  # REMEMBERED | WEAK | FORGOTTEN | UNDETERMINED (agent.recall.verdicts), None without an expectation
    detail: str = ""


# ---- events streamed from a running turn ------------------------------------------------


@dataclass(frozen=True)
class TurnStarted:
    user_turn: TurnView | None  # None for regenerate
    assistant_turn_id: int
    recall_turn: TurnView | None = None  # the recall block folded before the message, if any


@dataclass(frozen=True)
class TokenEvent:
    text: str


@dataclass(frozen=True)
class ProgressEvent:
    label: str
    done: int
    total: int


@dataclass(frozen=True)
class StatsEvent:
    new_tokens: int
    tokens_per_s: float
    tokens_folded: int
    state_bytes: int


@dataclass(frozen=True)
class TurnFinished:
    turn: TurnView  # final status: complete | cancelled | error


@dataclass(frozen=True)
class ErrorEvent:
    message: str


ChatEvent = Union[TurnStarted, TokenEvent, ProgressEvent, StatsEvent, TurnFinished, ErrorEvent]


class ChatError(RuntimeError):
    """A user-facing problem: the message is one line naming the cause and the way out."""


class SessionNotFoundError(ChatError):
    """No session matches the id given (the server answers 404)."""


class SessionBusyError(ChatError):
    """Another writer holds the session (the server answers 409)."""


class StateUnusableError(ChatError):
    """The stored state cannot be used (other model, corrupt, disagrees with the transcript).
    The client may offer `ChatService.rebuild_state()` (replays the transcript)."""


class ChatServiceProtocol(Protocol):
    """What clients may call. Methods that stream return iterators of ChatEvent and honour
    `cancel` between tokens; they are meant to be consumed in a worker thread."""

    @property
    def session(self) -> SessionView | None: ...
    def status(self) -> StatusView: ...
    def new_session(self, *, system: str | None = None, name: str | None = None) -> SessionView: ...
    def resume(self, uid_prefix: str | None = None) -> SessionView: ...  # None: most recent
    def rebuild_state(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]: ...
    def tail(self, limit: int = 50) -> list[TurnView]: ...
    def page_before(self, turn_id: int, limit: int = 50) -> list[TurnView]: ...
    # Which of these turns (of the current branch) the state no longer holds exactly: all
    # their tokens left a window model's sinks, window and memory, so only the transcript
    # holds their words (recall refresh can read them back in). None: no answer (no state
    # loaded, or a model whose state holds no exact tokens): leave marks as they are.
    def transcript_only(self, turn_ids: Sequence[int]) -> set[int] | None: ...
    def send(self, text: str, cancel: threading.Event | None = None) -> Iterator[ChatEvent]: ...
    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]: ...
    def switch_sibling(self, turn_id: int, step: int) -> TurnView: ...  # move the head to another branch
    def attach(self, path: Path, cancel: threading.Event | None = None) -> Iterator[ChatEvent]: ...
    def probe(self, question: str, expected: str | None = None) -> ProbeAnswer: ...
    def fork(self, at_turn: int | None = None) -> SessionView: ...
    def rename(self, name: str) -> SessionView: ...
    def set_system(self, text: str) -> SessionView: ...
    def set_option(self, key: str, value: str) -> None: ...
    def list_sessions(self) -> list[SessionView]: ...
    def search(self, query: str, limit: int = 50) -> list[SearchHit]: ...
    def delete_session(self, uid_prefix: str) -> None: ...
    def export(self, fmt: Literal["markdown", "json"], path: Path | None = None) -> Path: ...
    def close(self) -> None: ...


class StateCheck(Protocol):
    """Asks a copy of a state a question and, with `expect`, judges the answer: what `probe`
    runs. The CLI passes `agent.probes.session_check.check_state`, the same check as
    `laplace probe session`, so chat itself never imports the probes."""

    def __call__(self, loaded: LoadedModel, state: RecurrentState, question: str, *, expect: str | None,
                 answer_tokens: int) -> CheckResult: ...


class CheckResult(Protocol):
    answer: str
    verdict: str
    reason: str


@dataclass
class TurnResult:
    """What `laplace ask --json` prints."""

    session_uid: str
    user_turn_id: int
    assistant_turn_id: int
    reply: str
    status: TurnStatus
    new_tokens: int
    tokens_per_s: float
    tokens_folded: int
    extra: dict[str, object] = field(default_factory=dict)
