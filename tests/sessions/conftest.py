"""Fixtures: every test gets its own LAPLACE_HOME and a store in it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import pytest

from sessions import SessionStore, StateMeta, Turn, chain_hash

FINGERPRINT = "fp-tiny-0001"


@pytest.fixture(autouse=True)
def laplace_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LAPLACE_HOME", str(home))
    return home


@pytest.fixture
def db_path(laplace_home: Path) -> Path:
    return laplace_home / "laplace.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SessionStore]:
    with SessionStore.open(db_path) as s:
        yield s


def fake_state(stream_hash: str, size: int = 4096) -> bytes:
    """A stand-in for a model state: a deterministic function of the token stream folded in,
    so a replay of the transcript (recomputing the chain hash) rebuilds the same bytes."""
    seed = hashlib.sha256(stream_hash.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def meta(**kw: object) -> StateMeta:
    return StateMeta(model_fingerprint=FINGERPRINT, **kw)  # type: ignore[arg-type]


def tokens_of(text: str) -> list[int]:
    """A byte-level 'tokenizer' plus a fake template token, enough for the store."""
    return [1] + list(text.encode())


def converse(store: SessionStore, session: object, text: str, reply: str | None = None,
             size: int = 4096) -> Turn:
    """One user + assistant exchange committed with its state, as the chat service would."""
    store.turns.begin_turn(session, role="user", content=text, token_ids=tokens_of(text))
    a = store.turns.begin_turn(session, role="assistant")
    reply = reply if reply is not None else f"re: {text}"
    store.turns.update_streaming(a.id, reply[: len(reply) // 2])
    ids = tokens_of(reply)
    expected = chain_hash(store.tree.get_turn(a.parent_id).stream_hash, ids)
    return store.turns.commit_turn(a.id, content=reply, token_ids=ids, state=fake_state(expected, size),
                             state_meta=meta())
