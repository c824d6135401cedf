"""Column lists and row -> record conversions shared by the store's modules."""

from __future__ import annotations

import json
from typing import Any, Sequence

from .records import RunRecord, Session, Snapshot, Turn

SESSION_COLS = (
    "id, uid, name, model_id, system_prompt, options, head_turn_id, forked_from_session_id, "
    "forked_from_turn_id, keep_snapshots, archived, created_at, updated_at"
)
# token_ids is left out on purpose: listing turns must not read the token blobs.
TURN_COLS = (
    "id, session_id, parent_id, depth, role, content, status, n_tokens, tokens_total, "
    "stream_hash, stats, error, created_at, updated_at"
)
SNAPSHOT_COLS = (
    "s.id, s.uid, s.session_id, s.turn_id, t.depth, s.n_tokens, s.stream_hash, "
    "s.model_fingerprint, s.format, s.dtype, s.byte_size, s.sha256, s.extra, s.created_at"
)
RUN_COLS = "id, uid, created_at, model_id, kind, payload, session_id"


def prefixed(cols: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in cols.split(","))


def to_session(row: Sequence[Any]) -> Session:
    return Session(
        id=row[0],
        uid=row[1],
        name=row[2],
        model_id=row[3],
        system_prompt=row[4],
        options=json.loads(row[5] or "{}"),
        head_turn_id=row[6],
        forked_from_session_id=row[7],
        forked_from_turn_id=row[8],
        keep_snapshots=row[9],
        archived=bool(row[10]),
        created_at=row[11],
        updated_at=row[12],
    )


def to_turn(row: Sequence[Any]) -> Turn:
    return Turn(
        id=row[0],
        session_id=row[1],
        parent_id=row[2],
        depth=row[3],
        role=row[4],
        content=row[5],
        status=row[6],
        n_tokens=row[7],
        tokens_total=row[8],
        stream_hash=row[9],
        stats=json.loads(row[10] or "{}"),
        error=row[11],
        created_at=row[12],
        updated_at=row[13],
    )


def to_snapshot(row: Sequence[Any]) -> Snapshot:
    return Snapshot(
        id=row[0],
        uid=row[1],
        session_id=row[2],
        turn_id=row[3],
        depth=row[4],
        n_tokens=row[5],
        stream_hash=row[6],
        model_fingerprint=row[7],
        format=row[8],
        dtype=row[9],
        byte_size=row[10],
        sha256=row[11],
        extra=json.loads(row[12] or "{}"),
        created_at=row[13],
    )


def to_run(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        id=row[0],
        uid=row[1],
        created_at=row[2],
        model_id=row[3],
        kind=row[4],
        payload=json.loads(row[5] or "{}"),
        session_id=row[6],
    )
