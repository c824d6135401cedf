"""Plain records returned by `SessionStore`: frozen dataclasses, no behaviour, no SQL.

Token id blobs and state bytes are never part of these records, so listing turns or
sessions never pulls megabytes off disk; ask the store for them explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "document"]
Status = Literal["streaming", "complete", "cancelled", "error"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "document")
STATUSES: tuple[str, ...] = ("streaming", "complete", "cancelled", "error")


@dataclass(frozen=True, kw_only=True)
class Session:
    id: int
    uid: str
    name: str | None
    model_id: str
    system_prompt: str
    options: dict[str, Any]
    head_turn_id: int | None
    forked_from_session_id: int | None
    forked_from_turn_id: int | None
    keep_snapshots: int
    archived: bool
    created_at: str
    updated_at: str

    @property
    def short_id(self) -> str:
        return self.uid[:8]


@dataclass(frozen=True, kw_only=True)
class SessionSummary:
    """A session plus the cheap (O(1) per session) figures `sessions list` shows."""

    session: Session
    turns: int  # turns on the current branch, the root system turn excluded
    tokens_folded: int  # tokens folded in up to the head
    state_bytes: int  # size of the newest snapshot, 0 if none
    snapshots: int


@dataclass(frozen=True, kw_only=True)
class Turn:
    id: int
    session_id: int
    parent_id: int | None
    depth: int  # root system turn is 0
    role: str
    content: str
    status: str
    n_tokens: int
    tokens_total: int  # tokens folded in from the root up to and including this turn
    stream_hash: str
    stats: dict[str, Any]
    error: str | None
    created_at: str
    updated_at: str

    @property
    def token_start(self) -> int:
        """First position of this turn's span in the session's token stream."""
        return self.tokens_total - self.n_tokens


@dataclass(frozen=True, kw_only=True)
class StateMeta:
    """What the caller knows about a state it hands over (the bytes stay opaque).

    `n_tokens` and `stream_hash`, when given, are checked against the turn the state is
    stored for, so a caller cannot pair a state with the wrong transcript by mistake.
    """

    model_fingerprint: str
    format: str = "safetensors"
    dtype: str = "float32"
    n_tokens: int | None = None
    stream_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    id: int
    uid: str
    session_id: int
    turn_id: int
    depth: int
    n_tokens: int
    stream_hash: str
    model_fingerprint: str
    format: str
    dtype: str
    byte_size: int
    sha256: str
    extra: dict[str, Any]
    created_at: str


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """Everything needed to continue a session, gathered in time independent of its length."""

    session: Session
    head: Turn
    turns: list[Turn]  # tail of the branch, oldest first
    has_older: bool  # more turns before `turns[0]` (page them with `page_before`)
    snapshot: Snapshot | None  # newest snapshot on the branch
    state: bytes | None  # its verified bytes (None without a snapshot or when not loaded)

    @property
    def tokens_to_fold(self) -> int:
        """Tokens on the branch after the snapshot; the caller folds these before generating."""
        return self.head.tokens_total - (self.snapshot.n_tokens if self.snapshot else 0)


@dataclass(frozen=True, kw_only=True)
class SearchHit:
    session_uid: str
    session_name: str | None
    turn_id: int
    role: str
    snippet: str
    created_at: str


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A probe run or finetune run row; `payload` is whatever JSON that feature stores."""

    id: int
    uid: str
    created_at: str
    model_id: str
    kind: str
    payload: dict[str, Any]
    session_id: int | None


@dataclass(frozen=True, kw_only=True)
class LeaseInfo:
    session_id: int
    owner: str
    pid: int
    hostname: str
    expires_at: float
