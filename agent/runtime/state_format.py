"""The byte format of a saved `RecurrentState`, without torch: write and read state blobs.

`state.RecurrentState.to_bytes` / `from_bytes` are thin torch wrappers over `encode_state`
and `decode_state`, so a process with no torch (a session tool, a native engine) writes and
reads the very same bytes. A blob is safetensors bytes:

- an 8-byte little-endian header length, then the header: compact JSON, `__metadata__`
  first with its keys sorted, then each tensor by sorted name (dtype, shape, data
  offsets), padded with spaces to 8 bytes; then the tensors' raw bytes in that order.
  Writing it here (not with the safetensors library, which orders metadata arbitrarily)
  is what makes equal states give equal bytes;
- metadata: format, format_version, layout, dtype, fingerprint, n_tokens, checksum,
  extra (JSON) and, when known, architecture;
- the checksum: sha256 over each tensor's shape (as Python prints a tuple) and bytes, in
  layout order, so it does not depend on the header's sorted order.

A gla/conv state is version 1, its layout always `STATE_LAYOUT` (so old blobs load and equal
states give equal bytes); any other layout is version 3, the layout naming each tensor and
its shape in the state's own order. Version 2 stored the window ring's keys un-rotated:
`native.engine.rotate_ring_keys` (or `window.rotate_ring_keys`) converts them.

Tensors travel as `(name, dtype code, shape, raw bytes)`: dtype code "F32", "I64" or "BF16"
(a memory's keys and values), raw
bytes little-endian and C-order (bytes, bytearray or memoryview).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union

if TYPE_CHECKING:
    import numpy as np

STATE_FORMAT = "laplace-state"
STATE_FORMAT_VERSION = 3
LEGACY_FORMAT_VERSION = 1  # the gla/conv layout, written byte for byte as before named tensors
UNROTATED_FORMAT_VERSION = 2  # named tensors, the window ring's keys stored un-rotated
READABLE_VERSIONS = (str(LEGACY_FORMAT_VERSION), str(UNROTATED_FORMAT_VERSION), str(STATE_FORMAT_VERSION))
POSITIONS = "pos"  # the tensor of tokens read per row [1, B]: the model's, not a layer's
STATE_LAYOUT = "gla[L,B,H,K,V]+conv[L,B,D,W]"  # D: the conv's channels (conv_dim)
DTYPE_SIZES = {"F32": 4, "I64": 8, "BF16": 2}  # the dtypes a state holds: fp32 numbers, int64 counts, the memory's bf16
_UNPACK = {"F32": "<f", "I64": "<q"}
_REPLAY = "replay the transcript into a fresh state"

Buffer = Union[bytes, bytearray, memoryview]
RawTensor = tuple[str, str, Sequence[int], Buffer]  # (name, dtype code, shape, raw bytes)
DecodedTensor = tuple[str, tuple[int, ...], memoryview]  # (dtype code, shape, raw bytes)


class StateError(ValueError):
    """A serialized state cannot be used."""


class StateCorruptError(StateError):
    """The bytes are truncated, not a state, or fail their checksum."""


class StateModelMismatchError(StateError):
    """The state was written by a different model (fingerprint or shape differ)."""


# ---- layout and checksum -------------------------------------------------------------------


def layout_names(layout: str) -> list[str]:
    """Tensor names of a layout string, in order: 'gla[..]+conv[..]' -> ['gla', 'conv']."""
    return [part.split("[", 1)[0] for part in layout.split("+") if part]


def layout_string(tensors: Iterable[tuple[str, Sequence[int]]]) -> str:
    """The layout of a named-tensor state: (name, shape) pairs -> 'win_k[2,1,2,10,8]+pos[1,1]'."""
    return "+".join(f"{name}[{','.join(map(str, shape))}]" for name, shape in tensors)


def checksum(tensors: Iterable[tuple[Sequence[int], Buffer]]) -> str:
    """sha256 over each (shape, raw bytes), in layout order (gla then conv for v1)."""
    h = hashlib.sha256()
    for shape, raw in tensors:
        h.update(str(tuple(shape)).encode())
        h.update(raw)
    return h.hexdigest()


def _flat(raw: Buffer) -> memoryview:
    # A byte view: a memoryview of typed items (a numpy array's, say) would count items, not bytes.
    view = memoryview(raw)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _nbytes(code: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * DTYPE_SIZES[code]


# ---- the safetensors container ---------------------------------------------------------------


def safetensors_bytes(tensors: Sequence[RawTensor], meta: Mapping[str, str]) -> bytes:
    """The safetensors layout, written with sorted keys so equal states give equal bytes
    (the library's own writer orders metadata arbitrarily)."""
    by_name = {name: (code, shape, _flat(raw)) for name, code, shape, raw in tensors}
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))}
    offset, payload = 0, []
    for name in sorted(by_name):
        code, shape, raw = by_name[name]
        header[name] = {"dtype": code, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + raw.nbytes]}
        payload.append(raw)
        offset += raw.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # align the payload to 8 bytes, as the format allows
    return len(head).to_bytes(8, "little") + head + b"".join(payload)


def _read_header(data: Buffer) -> tuple[dict[str, Any], int]:
    """The JSON header of safetensors bytes and where the payload starts."""
    view = _flat(data)
    if len(view) < 8:
        raise StateCorruptError(f"state is truncated ({len(view)} bytes); {_REPLAY}")
    header_len = int.from_bytes(view[:8], "little")
    if header_len <= 0 or 8 + header_len > len(view):
        raise StateCorruptError(f"state header is truncated or corrupt; {_REPLAY}")
    try:
        header = json.loads(bytes(view[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise StateCorruptError(f"state header is not valid; {_REPLAY}")
    return header, 8 + header_len


def _checked_meta(header: dict[str, Any]) -> dict[str, str]:
    meta = header.get("__metadata__", {})
    if meta.get("format") != STATE_FORMAT:
        raise StateCorruptError(f"bytes are not a laplace state; {_REPLAY}")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise StateCorruptError(
            f"state format version {meta.get('format_version')} is not supported (expected one of "
            f"{', '.join(READABLE_VERSIONS)}); replay the transcript"
        )
    return {str(k): str(v) for k, v in meta.items()}


def read_state_metadata(data: Buffer) -> dict[str, str]:
    """Header metadata of serialized state bytes, checked for format and version."""
    return _checked_meta(_read_header(data)[0])


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_tensors(data: Buffer, header: dict[str, Any], start: int) -> dict[str, DecodedTensor]:
    """Each tensor's (dtype code, shape, bytes: a view of `data`) by name, in payload order,
    checked as the safetensors library checks a file: known dtypes, offsets that tile the
    payload exactly from 0 to its end, and each tensor's bytes fitting its dtype and shape."""
    def corrupt(why: str) -> StateCorruptError:
        return StateCorruptError(f"state bytes are corrupt ({why}); {_REPLAY}")

    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise corrupt(f"tensor {name!r} has no description")
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if code not in DTYPE_SIZES:
            raise corrupt(f"tensor {name!r} has dtype {code!r}, not one of {', '.join(DTYPE_SIZES)}")
        if not isinstance(shape, list) or not all(map(_is_count, shape)):
            raise corrupt(f"tensor {name!r} has shape {shape!r}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
            raise corrupt(f"tensor {name!r} has data offsets {offsets!r}")
        spans.append((offsets[0], offsets[1], name, code, tuple(shape)))
    view = _flat(data)
    end, out = 0, {}
    for begin, stop, name, code, shape in sorted(spans):
        if begin != end or stop < begin:
            raise corrupt(f"tensor {name!r} has offsets [{begin}, {stop}], not starting at {end}")
        if stop - begin != _nbytes(code, shape):
            raise corrupt(f"tensor {name!r} holds {stop - begin} bytes, not the {_nbytes(code, shape)} of {code}{list(shape)}")
        out[name] = (code, shape, view[start + begin : start + stop])
        end = stop
    if start + end != len(view):
        raise corrupt(f"the payload is {len(view) - start} bytes, its tensors {end}")
    return out


# ---- states ------------------------------------------------------------------------------------


def check_positions(tensors: Mapping[str, tuple[str, Sequence[int], Buffer]], n_tokens: int) -> None:
    """A batch-1 state's positions tensor [1, 1] must equal n_tokens, the host's count
    (tensors: name -> (dtype code, shape, raw bytes)); a state without one passes."""
    entry = tensors.get(POSITIONS)
    if entry is None:
        return
    code, shape, raw = entry
    if len(shape) >= 2 and shape[1] == 1 and math.prod(shape) > 0:
        size = DTYPE_SIZES[code]
        read = int(struct.unpack(_UNPACK[code], _flat(raw)[:size])[0])
        if read != n_tokens:
            raise StateCorruptError(f"state says it read {read} tokens but its host count is {n_tokens}; {_REPLAY}")


def encode_state(
    tensors: Sequence[RawTensor],
    *,
    n_tokens: int,
    fingerprint: str,
    architecture: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """The bytes of a state: `tensors` (name, "F32" | "I64" | "BF16", shape, raw bytes) in the
    state's own order, batch at dim 1. A gla+conv state is version 1, any other version 3.
    Raises ValueError for tensors that do not fit their description, and StateCorruptError
    when a batch-1 state's positions disagree with `n_tokens`."""
    entries = [(name, code, tuple(int(d) for d in shape), _flat(raw)) for name, code, shape, raw in tensors]
    by_name = {name: (code, shape, raw) for name, code, shape, raw in entries}
    if not entries or len(by_name) != len(entries):
        raise ValueError(f"a state needs distinct tensors, not {[e[0] for e in entries]}")
    for name, code, shape, raw in entries:
        if code not in DTYPE_SIZES:
            raise ValueError(f"tensor {name!r} has dtype {code!r}, not one of {', '.join(DTYPE_SIZES)}")
        if raw.nbytes != _nbytes(code, shape):
            raise ValueError(f"tensor {name!r} has {raw.nbytes} bytes, not the {_nbytes(code, shape)} of {code}{list(shape)}")
    check_positions(by_name, n_tokens)
    legacy = set(by_name) == {"gla", "conv"}
    layout = STATE_LAYOUT if legacy else layout_string((name, shape) for name, _, shape, _ in entries)
    meta = {
        "format": STATE_FORMAT,
        "format_version": str(LEGACY_FORMAT_VERSION if legacy else STATE_FORMAT_VERSION),
        "layout": layout,
        "dtype": "float32",
        "fingerprint": fingerprint,
        "n_tokens": str(n_tokens),
        "checksum": checksum(by_name[n][1:] for n in layout_names(layout)),
        "extra": json.dumps(dict(extra or {}), sort_keys=True),
    }
    if architecture is not None:
        meta["architecture"] = architecture
    return safetensors_bytes(entries, meta)


@dataclass(frozen=True)
class DecodedState:
    """A verified blob: its metadata, format version, host token count, and tensors by name
    in layout order as (dtype code, shape, bytes): read-only views of the blob, so copy
    before writing (the decode step writes a state in place)."""

    meta: dict[str, str]
    version: int
    n_tokens: int
    tensors: dict[str, DecodedTensor]

    @property
    def unrotated_keys(self) -> bool:
        """A version-2 window state: its ring keys need `native.engine.rotate_ring_keys` (or the torch
        `window.rotate_ring_keys`) with the model's rope theta before use."""
        return self.version == UNROTATED_FORMAT_VERSION and "win_k" in self.tensors


def decode_state(data: Buffer, *, fingerprint: str | None = None, architecture: str | None = None) -> DecodedState:
    """Parse and verify state bytes: format and version, the container, the tensor set
    against the layout, the checksum, the positions against the host count, and, when given,
    the architecture (if the blob records one) and the fingerprint. Raises
    `StateCorruptError` or `StateModelMismatchError` with a message that says how to recover.
    What needs the model's config (the shapes, a v2 ring's rotation) is the caller's."""
    header, start = _read_header(data)
    meta = _checked_meta(header)
    tensors = read_tensors(data, header, start)
    version = int(meta["format_version"])
    layout = STATE_LAYOUT if version == LEGACY_FORMAT_VERSION else meta.get("layout", "")
    names = layout_names(layout)
    if set(tensors) != set(names) or len(names) != len(set(names)):
        raise StateCorruptError(f"state holds tensors {sorted(tensors)}, not its layout's {names}; replay the transcript")
    if meta.get("checksum") != checksum(tensors[n][1:] for n in names):
        raise StateCorruptError(f"state checksum mismatch: the bytes were altered; {_REPLAY}")
    # States written before the architecture was recorded have no such key.
    if architecture is not None and "architecture" in meta and meta["architecture"] != architecture:
        raise StateModelMismatchError(
            f"state was written by a {meta['architecture']} model, not this {architecture} one; "
            "load the original model, or replay the transcript into a fresh state for this one"
        )
    if fingerprint is not None and meta.get("fingerprint") != fingerprint:
        raise StateModelMismatchError(
            f"state was written by model {meta.get('fingerprint', '?')[:12]}, not the loaded model {fingerprint[:12]}; "
            "load the original model, or replay the transcript into a fresh state for this one"
        )
    try:
        n_tokens = int(meta.get("n_tokens", "0"))
    except ValueError:
        raise StateCorruptError(f"state token count {meta.get('n_tokens')!r} is not a number; {_REPLAY}") from None
    ordered = {n: tensors[n] for n in names}
    check_positions(ordered, n_tokens)
    return DecodedState(meta=meta, version=version, n_tokens=n_tokens, tensors=ordered)
