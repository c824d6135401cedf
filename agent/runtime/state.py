"""`RecurrentState`: the fixed-size memory of a sequence, and its verifiable byte format.

A state is a set of named tensors, batch always at dim 1, whose names and shapes the
model's config gives (`LaplaceConfig.state_spec`):

- gla and ssd mixers: `gla` [L, B, H, K, V], the Simple-GLA matrices, and `conv`
  [L, B, C, W], the depthwise conv cache (the last W inputs to the conv: C = d_model for
  the Laplace mixer, the x/B/C width for a Mamba-2 mixer);
- the window mixer: the ring buffer `win_k` / `win_v` [L, B, G, S + W, D] of keys (each
  rotated to its slot's angle) and values (slots < S hold the sinks), the GLA branch's
  `gla` [L, B, H, F, D + 1] when it is on;
- `pos` [1, B] int64, the tokens each row has read, in a state whose mixers use
  positions (POSITIONS: the one tensor with no layer dimension). For a batch-1 state it
  must equal `n_tokens`, the host's count: saving and loading check it.

Float tensors are fp32. Its size does not depend on how many tokens were folded in.

Serialized form (`state_format`, torch-free, so a process without torch reads and writes the
same bytes): safetensors bytes with string metadata: format version, model fingerprint,
tokens folded in, layout, dtype, architecture, and a sha256 checksum over the tensor payload
in layout order. A gla/conv state is written exactly as format version 1 always was (so
old blobs load and equal states give equal bytes); any other layout is version 3. Version 2
was the same with the window ring's keys un-rotated: such a state is rotated on load
(which needs the model's config), so stored sessions keep working.
`from_bytes` refuses truncated or corrupt bytes and a state written by another model, each
with its own error class and a message that says how to recover.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Mapping

import torch
from torch import Tensor

from agent.runtime.config import LaplaceConfig
from agent.runtime.state_spec import layer_rows
from agent.runtime.state_format import (  # re-exported: the format's names are importable from here too
    LEGACY_FORMAT_VERSION,
    POSITIONS,
    READABLE_VERSIONS,
    STATE_FORMAT,
    STATE_FORMAT_VERSION,
    STATE_LAYOUT,
    UNROTATED_FORMAT_VERSION,
    StateCorruptError,
    StateError,
    StateModelMismatchError,
    decode_state,
    encode_state,
    layout_names,
    read_state_metadata,
)

__all__ = [
    "LEGACY_FORMAT_VERSION", "POSITIONS", "READABLE_VERSIONS", "STATE_FORMAT", "STATE_FORMAT_VERSION", "STATE_LAYOUT",
    "UNROTATED_FORMAT_VERSION", "RecurrentState", "StateCorruptError", "StateError", "StateModelMismatchError",
    "layout_names", "read_state_metadata", "tensor_bytes",
]

_DTYPES = {"float32": (torch.float32, "F32"), "int64": (torch.int64, "I64"), "bfloat16": (torch.bfloat16, "BF16")}
_CODES = {code: dtype for dtype, code in _DTYPES.values()}


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
    def layer_tensors(self) -> dict[str, Tensor]:
        """The per-layer tensors (layer at dim 0): everything but the positions."""
        return {n: t for n, t in self.tensors.items() if n != POSITIONS}

    @property
    def positions(self) -> Tensor | None:
        """[B] int64: tokens each row has read (a view of the state's tensor), or None for a
        state whose mixers use no positions (then `n_tokens` is the only count)."""
        t = self.tensors.get(POSITIONS)
        return None if t is None else t[0]

    def layer_views(self, config: LaplaceConfig) -> list[dict[str, Tensor]]:
        """Per layer, a dict of views of the per-layer tensors (for the in-place decode step),
        made once per set of tensors rather than once per token. `config` says which layers
        own a row of the memory's tensors (`state_spec.layer_rows`)."""
        key = tuple(map(id, self.tensors.values()))
        cached = self.__dict__.get("_views")
        if cached is None or cached[0] != key:
            layers = self.layer_tensors
            cached = (key, [{name: layers[src][r] for name, (src, r) in rows.items()} for rows in layer_rows(config, layers)])
            self.__dict__["_views"] = cached
        return cached[1]

    def advanced(self, layers: Mapping[str, Tensor], count: int | Tensor) -> "RecurrentState":
        """A new state of these per-layer tensors with `count` more tokens read: an int for
        every row (the host count too), or lengths [B] for padded rows (then the host count
        is left to the caller, who knows it). The one place a sequence call counts tokens."""
        tensors = dict(layers)
        pos = self.tensors.get(POSITIONS)
        if pos is not None:
            tensors[POSITIONS] = pos + (count if isinstance(count, int) else count.to(pos.dtype)[None, :])
        return RecurrentState(tensors, self.n_tokens + (count if isinstance(count, int) else 0))

    def advance_(self, n: int) -> None:
        """Count `n` more tokens read by every row, in place: the host's n_tokens and the
        positions tensor (if any) together. The one place a decode step counts tokens."""
        self.n_tokens += n
        t = self.tensors.get(POSITIONS)
        if t is not None:
            t.add_(n)

    def check_positions(self) -> None:
        """A batch-1 state's positions tensor must equal n_tokens (they are kept apart, the
        host's count and the model's, so a caller that forgot one is caught here)."""
        t = self.tensors.get(POSITIONS)
        if t is not None and t.shape[1] == 1 and int(t[0, 0]) != self.n_tokens:
            raise StateCorruptError(
                f"state says it read {int(t[0, 0])} tokens but its host count is {self.n_tokens}; "
                "replay the transcript into a fresh state")

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
        `architecture` (`LaplaceConfig.architecture()`) names what the state's numbers mean.
        bf16 tensors (the memory's keys and values) are written as bf16, other floats as fp32,
        anything else as int64; `encode_state` checks the positions against n_tokens, as
        `check_positions` does."""
        raw = []
        for name, t in self.tensors.items():
            kind = "bfloat16" if t.dtype == torch.bfloat16 else "float32" if t.is_floating_point() else "int64"
            dtype, code = _DTYPES[kind]
            t = t.detach().to("cpu", dtype)
            raw.append((name, code, tuple(t.shape), tensor_bytes(t)))
        return encode_state(raw, n_tokens=self.n_tokens, fingerprint=fingerprint, architecture=architecture, extra=extra)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        config: LaplaceConfig | None = None,
        fingerprint: str | None = None,
        device: torch.device | str = "cpu",
    ) -> "RecurrentState":
        """Parse and verify. Raises `StateCorruptError` or `StateModelMismatchError`.
        `decode_state` does every check but the two that need the config (the shapes, and a
        version-2 ring's rotation), the positions against n_tokens among them."""
        decoded = decode_state(data, fingerprint=fingerprint, architecture=None if config is None else config.architecture())
        if decoded.unrotated_keys and config is None:
            raise StateModelMismatchError("this window state predates rotated ring keys and needs its model's config to "
                                          "load; open it with the model loaded, or replay the transcript")
        tensors = {n: _tensor(code, shape, raw).to(device) for n, (code, shape, raw) in decoded.tensors.items()}
        state = cls(tensors, decoded.n_tokens, decoded.meta)
        if config is not None:
            state.check_shape(config)
        if decoded.unrotated_keys:  # version 2: rotate each ring key to its slot's angle, as version 3 stores it
            assert config is not None
            from agent.runtime.window import rotate_ring_keys  # the math lives in the runtime's mixer

            state.tensors["win_k"] = rotate_ring_keys(state.tensors["win_k"], config.rope_theta)
        return state


def _tensor(code: str, shape: tuple[int, ...], raw: memoryview) -> Tensor:
    """A tensor of a blob's bytes, copied: the blob is read-only and the step writes in place."""
    if raw.nbytes == 0:
        return torch.zeros(shape, dtype=_CODES[code])
    return torch.frombuffer(bytearray(raw), dtype=_CODES[code]).reshape(shape)


def tensor_bytes(t: Tensor) -> bytes:
    """The raw bytes of a tensor (moved to CPU and made contiguous first), read through
    ctypes while `t` is alive, and copied (no detour through numpy)."""
    t = t.detach().to("cpu").contiguous()
    n = t.numel() * t.element_size()
    if n == 0:
        return b""
    return bytes((ctypes.c_ubyte * n).from_address(t.data_ptr()))
