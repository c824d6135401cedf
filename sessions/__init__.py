"""Persistence of chat sessions: transcripts as turn trees and recurrent states, in SQLite.

Standard library and sqlite-utils only; never torch. State bytes are opaque here.
"""

from __future__ import annotations

from .errors import (
    AmbiguousSessionId,
    DamagedTokenIds,
    ForeignDatabase,
    InvalidTurnOperation,
    SchemaTooOld,
    SessionError,
    SessionInUse,
    SessionNotFound,
    StateChecksumError,
    StateError,
    StateModelMismatch,
    StateTranscriptMismatch,
    TurnNotFound,
)
from .hashing import GENESIS_HASH, chain_hash, pack_ids, unpack_ids
from .records import LeaseInfo, Resumed, RunRecord, SearchHit, Session, SessionSummary, Snapshot, StateMeta, Turn
from .store import SessionStore
from .store_leases import Lease

__all__ = [
    "AmbiguousSessionId", "DamagedTokenIds", "ForeignDatabase", "GENESIS_HASH", "InvalidTurnOperation", "Lease",
    "LeaseInfo", "Resumed", "RunRecord", "SchemaTooOld", "SearchHit", "Session", "SessionError", "SessionInUse",
    "SessionNotFound", "SessionStore", "SessionSummary", "Snapshot", "StateChecksumError",
    "StateError", "StateMeta", "StateModelMismatch", "StateTranscriptMismatch", "Turn",
    "TurnNotFound", "chain_hash", "pack_ids", "unpack_ids",
]
