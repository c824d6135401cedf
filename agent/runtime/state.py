"""`RecurrentState`: the fixed-size memory of a sequence, and its verifiable byte format.

A state is a set of named tensors, batch always at dim 1, whose names and shapes the
model's config gives (`LaplaceConfig.state_spec`):

- gla and ssd mixers: `gla` [L, B, H, K, V], the Simple-GLA matrices, and `conv`
  [L, B, C, W], the depthwise conv cache (the last W inputs to the conv: C = d_model for
  the Laplace mixer, the x/B/C width for a Mamba-2 mixer);
- the window mixer: the ring buffer `win_k` / `win_v` [L, B, G, S + W, D] of un-rotated
  keys and values (slots < S hold the sinks), the GLA branch's `gla` [L, B, H, F, D + 1]
  when it is on, and `pos` [1, B] int64, the tokens each row has read.

Float tensors are fp32. Its size does not depend on how many tokens were folded in.

Serialized form: safetensors bytes with string metadata: format version, model fingerprint,
tokens folded in, layout, dtype, architecture, and a sha256 checksum over the tensor payload
in layout order. A gla/conv state is written exactly as format version 1 always was (so
old blobs load and equal states give equal bytes); any other layout is version 2.
`from_bytes` refuses truncated or corrupt bytes and a state written by another model, each
with its own error class and a message that says how to recover.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from typing import Any, Callable, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from torch import Tensor

from agent.runtime.config import LaplaceConfig

STATE_FORMAT = "laplace-state"
STATE_FORMAT_VERSION = 2
LEGACY_FORMAT_VERSION = 1  # the gla/conv layout, written byte for byte as before named tensors
STATE_LAYOUT = "gla[L,B,H,K,V]+conv[L,B,D,W]"  # D: the conv's channels (conv_dim)
_DTYPES = {"float32": (torch.float32, "F32"), "int64": (torch.int64, "I64")}


class StateError(ValueError):
    """A serialized state cannot be used."""


class StateCorruptError(StateError):
    """The bytes are truncated, not a state, or fail their checksum."""


class StateModelMismatchError(StateError):
    """The state was written by a different model (fingerprint or shape differ)."""


def layout_names(layout: str) -> list[str]:
    """Tensor names of a layout string, in order: 'gla[..]+conv[..]' -> ['gla', 'conv']."""
    return [part.split("[", 1)[0] for part in layout.split("+") if part]


class RecurrentState:
    """Stacked per-layer state: named tensors, batch at dim 1 (see the module docstring).

    `gla` and `conv` read those tensors by name; `n_tokens` is host-side bookkeeping of how
    many tokens a batch-1 state has read; `meta` carries what `from_bytes` read."""

    def __init__(self, tensors: Mapping[str, Tensor], n_tokens: int = 0, meta: dict[str, str] | None = None) -> None:
        if not tensors:
            raise ValueError("a state needs at least one tensor")
        self.tensors: dict[str, Tensor] = dict(tensors)
        self.n_tokens = n_tokens
        self.meta: dict[str, str] = dict(meta or {})

    @classmethod
    def zeros(cls, config: LaplaceConfig, batch: int = 1, device: torch.device | str = "cpu") -> "RecurrentState":
        return cls({name: torch.zeros(shape, dtype=_DTYPES[dtype][0], device=device)
                    for name, (shape, dtype) in config.state_spec(batch).items()})

    def __getattr__(self, name: str) -> Tensor:
        # Only reached for attributes not set in __init__: the tensors by name (gla, conv, ...).
        tensors = self.__dict__.get("tensors")
        if tensors is not None and name in tensors:
            return tensors[name]
        held = ", ".join(tensors) if tensors else "nothing"
        raise AttributeError(f"this state has no tensor {name!r} (it holds {held})")

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    @property
    def batch_size(self) -> int:
        return next(iter(self.tensors.values())).shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def _map(self, fn: Callable[[Tensor], Tensor], *, keep: bool = True) -> "RecurrentState":
        """A state of fn(tensor) for each tensor; `keep` carries n_tokens and meta over."""
        out = {name: fn(t) for name, t in self.tensors.items()}
        return RecurrentState(out, self.n_tokens, self.meta) if keep else RecurrentState(out)

    def clone(self) -> "RecurrentState":
        """An independent copy: O(state), whatever the history length."""
        return self._map(Tensor.clone)

    def to(self, device: torch.device | str) -> "RecurrentState":
        return self._map(lambda t: t.to(device))

    # ---- batching -----------------------------------------------------------------------

    @classmethod
    def stack(cls, states: list["RecurrentState"]) -> "RecurrentState":
        """Join batch-1 (or any) states along the batch dimension."""
        if not states:
            raise ValueError("cannot stack an empty list of states")
        return cls({name: torch.cat([s.tensors[name] for s in states], dim=1) for name in states[0].tensors})

    def select(self, index: int) -> "RecurrentState":
        """Row `index` as a batch-1 state (a copy), laid out as a fresh one: a plain clone
        keeps the batch's strides on all-size-1 tensors (the window's `pos`, [1, 1]), and a
        compiled runner guards on strides, so it would compile again for such a row."""
        return self._map(lambda t: t[:, index : index + 1].clone(memory_format=torch.contiguous_format), keep=False)

    def index_select(self, index: Tensor) -> "RecurrentState":
        """The rows `index` (a 1-D long tensor), in that order."""
        return self._map(lambda t: t.index_select(1, index), keep=False)

    def first_rows(self, n: int) -> "RecurrentState":
        """Rows [0, n) (views), keeping n_tokens and meta: drops a padded batch's extra rows."""
        return self._map(lambda t: t[:, :n])

    def padded_to(self, batch: int) -> "RecurrentState":
        """Append zero rows up to `batch` (for fixed decode widths)."""
        extra = batch - self.batch_size
        if extra < 0:
            raise ValueError(f"state has {self.batch_size} rows, more than width {batch}")
        if extra == 0:
            return self
        return self._map(lambda t: torch.cat([t, t.new_zeros(t.shape[0], extra, *t.shape[2:])], 1))

    def max_abs_diff(self, other: "RecurrentState") -> float:
        """The largest elementwise difference over every tensor (the two must match in names)."""
        if self.names != other.names:
            raise ValueError(f"states hold different tensors: {self.names} vs {other.names}")
        return max(float((a.double() - other.tensors[n].double()).abs().max()) if a.numel() else 0.0
                   for n, a in self.tensors.items())

    def allclose(self, other: "RecurrentState", *, rtol: float, atol: float) -> bool:
        return self.names == other.names and all(
            torch.allclose(a.double(), other.tensors[n].double(), rtol=rtol, atol=atol) for n, a in self.tensors.items())

    def check_shape(self, config: LaplaceConfig) -> None:
        want = {name: (shape[0], *shape[2:]) for name, (shape, _) in config.state_spec().items()}
        got = {name: (t.shape[0], *t.shape[2:]) for name, t in self.tensors.items()}
        if got != want:
            show = lambda d: "/".join(f"{k}{v}" for k, v in d.items())  # noqa: E731
            raise StateModelMismatchError(
                f"state shape {show(got)} does not fit model {config.name} ({show(want)}); "
                "replay the transcript into a fresh state"
            )

    # ---- bytes --------------------------------------------------------------------------

    def to_bytes(self, *, fingerprint: str, extra: dict[str, str] | None = None, architecture: str | None = None) -> bytes:
        """Serialize (batch 1 or more) with a checksum over the exact tensor bytes.
        `architecture` (`LaplaceConfig.architecture()`) names what the state's numbers mean."""
        legacy = set(self.tensors) == {"gla", "conv"}
        layout = STATE_LAYOUT if legacy else "+".join(f"{n}[{','.join(map(str, t.shape))}]" for n, t in self.tensors.items())
        tensors = {}
        for name, t in self.tensors.items():
            dtype = torch.float32 if t.is_floating_point() else torch.int64
            tensors[name] = t.detach().to("cpu", dtype).contiguous()
        meta = {
            "format": STATE_FORMAT,
            "format_version": str(LEGACY_FORMAT_VERSION if legacy else STATE_FORMAT_VERSION),
            "layout": layout,
            "dtype": "float32",
            "fingerprint": fingerprint,
            "n_tokens": str(self.n_tokens),
            "checksum": _checksum([tensors[n] for n in layout_names(layout)]),
            "extra": json.dumps(extra or {}, sort_keys=True),
        }
        if architecture is not None:
            meta["architecture"] = architecture
        return _safetensors_bytes(tensors, meta)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        config: LaplaceConfig | None = None,
        fingerprint: str | None = None,
        device: torch.device | str = "cpu",
    ) -> "RecurrentState":
        """Parse and verify. Raises `StateCorruptError` or `StateModelMismatchError`."""
        meta = read_state_metadata(data)
        try:
            tensors = st_load(data)
        except (SafetensorError, ValueError, RuntimeError) as exc:
            raise StateCorruptError(f"state bytes are corrupt ({exc}); replay the transcript into a fresh state") from None
        layout = STATE_LAYOUT if meta["format_version"] == str(LEGACY_FORMAT_VERSION) else meta.get("layout", "")
        names = layout_names(layout)
        if set(tensors) != set(names) or len(names) != len(set(names)):
            raise StateCorruptError(f"state holds tensors {sorted(tensors)}, not its layout's {names}; replay the transcript")
        if meta.get("checksum") != _checksum([tensors[n] for n in names]):
            raise StateCorruptError("state checksum mismatch: the bytes were altered; replay the transcript into a fresh state")
        # States written before the architecture was recorded have no such key.
        if config is not None and "architecture" in meta and meta["architecture"] != config.architecture():
            raise StateModelMismatchError(
                f"state was written by a {meta['architecture']} model, not this {config.architecture()} one; "
                "load the original model, or replay the transcript into a fresh state for this one"
            )
        if fingerprint is not None and meta.get("fingerprint") != fingerprint:
            raise StateModelMismatchError(
                f"state was written by model {meta.get('fingerprint', '?')[:12]}, not the loaded model {fingerprint[:12]}; "
                "load the original model, or replay the transcript into a fresh state for this one"
            )
        state = cls({n: tensors[n].to(device) for n in names}, int(meta.get("n_tokens", "0")), meta)
        if config is not None:
            state.check_shape(config)
        return state


def read_state_metadata(data: bytes) -> dict[str, str]:
    """Header metadata of serialized state bytes, checked for format and version."""
    if len(data) < 8:
        raise StateCorruptError(f"state is truncated ({len(data)} bytes); replay the transcript into a fresh state")
    header_len = int.from_bytes(data[:8], "little")
    if header_len <= 0 or 8 + header_len > len(data):
        raise StateCorruptError("state header is truncated or corrupt; replay the transcript into a fresh state")
    try:
        header = json.loads(data[8 : 8 + header_len])
        meta: dict[str, Any] = header.get("__metadata__", {})
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise StateCorruptError("state header is not valid; replay the transcript into a fresh state") from None
    if meta.get("format") != STATE_FORMAT:
        raise StateCorruptError("bytes are not a laplace state; replay the transcript into a fresh state")
    if meta.get("format_version") not in (str(LEGACY_FORMAT_VERSION), str(STATE_FORMAT_VERSION)):
        raise StateCorruptError(
            f"state format version {meta.get('format_version')} is not supported (expected {LEGACY_FORMAT_VERSION} or "
            f"{STATE_FORMAT_VERSION}); replay the transcript"
        )
    return {str(k): str(v) for k, v in meta.items()}


def tensor_bytes(t: Tensor) -> bytes:
    """The raw bytes of a tensor (moved to CPU and made contiguous first), read through
    ctypes while `t` is alive, and copied (no detour through numpy)."""
    t = t.detach().to("cpu").contiguous()
    n = t.numel() * t.element_size()
    if n == 0:
        return b""
    return bytes((ctypes.c_ubyte * n).from_address(t.data_ptr()))


def _safetensors_bytes(tensors: dict[str, Tensor], meta: dict[str, str]) -> bytes:
    """The safetensors layout, written with sorted keys so equal states give equal bytes
    (the library's own writer orders metadata arbitrarily)."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))}
    offset, payload = 0, []
    for name in sorted(tensors):
        raw = tensor_bytes(tensors[name])
        code = "F32" if tensors[name].dtype == torch.float32 else "I64"
        header[name] = {"dtype": code, "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        payload.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # align the payload to 8 bytes, as the format allows
    return len(head).to_bytes(8, "little") + head + b"".join(payload)


def _checksum(tensors: list[Tensor]) -> str:
    """sha256 over each tensor's shape and bytes, in layout order (gla then conv for v1)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
