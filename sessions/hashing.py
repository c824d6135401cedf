"""The token-stream hash: a chain over the exact token ids folded into a state.

A state snapshot is only valid for the precise token stream that produced it, chat-template
tokens included. Each turn stores `chain_hash(parent.stream_hash, turn.token_ids)`, so the
check "does this snapshot belong to this transcript" is one string comparison, and a deep
check can recompute the chain from the stored token blobs.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Sequence

# Domain-separated so an empty stream never collides with sha256 of some other empty thing.
GENESIS_HASH = hashlib.sha256(b"laplace.token-stream.v1").hexdigest()


def pack_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes (the on-disk and hashed form)."""
    packed = array("i", token_ids)
    if sys.byteorder == "big":  # the format is little-endian whatever the host is
        packed.byteswap()
    return packed.tobytes()


def count_ids(blob: object) -> int | None:
    """How many ids a stored blob holds, or None when it is not `pack_ids` output (not bytes,
    or a length that is not a whole number of int32s: edited or damaged)."""
    if blob is None:
        return 0
    if not isinstance(blob, bytes) or len(blob) % 4:
        return None
    return len(blob) // 4


def unpack_ids(blob: bytes | None) -> list[int]:
    """Inverse of `pack_ids`; `None` (no tokens stored) is an empty list. The store checks a
    blob with `count_ids` before it gets here (`StoreCore.count_ids` names the turn)."""
    if not blob:
        return []
    if count_ids(blob) is None:
        raise ValueError(f"token ids must be whole little-endian int32s; got {len(blob)} bytes")
    ids = array("i")
    ids.frombytes(blob)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tolist()


def chain_hash(prev_hex: str, token_ids: Sequence[int]) -> str:
    """sha256(prev_hex as ascii + int32-LE bytes of `token_ids`) as hex."""
    return hashlib.sha256(prev_hex.encode("ascii") + pack_ids(token_ids)).hexdigest()


def chain_hash_packed(prev_hex: str, packed: bytes | None) -> str:
    """`chain_hash` for ids already packed by `pack_ids` (avoids a round trip)."""
    return hashlib.sha256(prev_hex.encode("ascii") + (packed or b"")).hexdigest()
