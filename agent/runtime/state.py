"""`RecurrentState`: the fixed-size memory of a sequence, and its verifiable byte format.

Per layer it holds the Simple-GLA matrices [B, H, K, V] and the depthwise conv cache
[B, C, W] (the last W inputs to the conv: C = d_model for the Laplace mixer, the x/B/C
width for a Mamba-2 mixer), both fp32, stacked over layers. Its size does
not depend on how many tokens were folded in.

Serialized form: safetensors bytes with string metadata: format version, model fingerprint,
tokens folded in, layout, dtype, and a sha256 checksum over the tensor payload. `from_bytes`
refuses truncated or corrupt bytes and a state written by another model, each with its own
error class and a message that says how to recover.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from torch import Tensor

from agent.runtime.config import LaplaceConfig

STATE_FORMAT = "laplace-state"
STATE_FORMAT_VERSION = 1
STATE_LAYOUT = "gla[L,B,H,K,V]+conv[L,B,D,W]"  # D: the conv's channels (conv_dim)


class StateError(ValueError):
    """A serialized state cannot be used."""


class StateCorruptError(StateError):
    """The bytes are truncated, not a state, or fail their checksum."""


class StateModelMismatchError(StateError):
    """The state was written by a different model (fingerprint or shape differ)."""


@dataclass
class RecurrentState:
    """Stacked per-layer state. `gla`: [L, B, H, K, V] fp32; `conv`: [L, B, D, W] fp32."""

    gla: Tensor
    conv: Tensor
    n_tokens: int = 0
    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def zeros(cls, config: LaplaceConfig, batch: int = 1, device: torch.device | str = "cpu") -> "RecurrentState":
        c = config
        return cls(
            gla=torch.zeros(c.n_layers, batch, c.n_heads, c.head_k_dim, c.head_v_dim, dtype=torch.float32, device=device),
            conv=torch.zeros(c.n_layers, batch, c.conv_dim, c.conv_size, dtype=torch.float32, device=device),
        )

    @property
    def batch_size(self) -> int:
        return self.gla.shape[1]

    @property
    def nbytes(self) -> int:
        return self.gla.numel() * self.gla.element_size() + self.conv.numel() * self.conv.element_size()

    @property
    def device(self) -> torch.device:
        return self.gla.device

    def clone(self) -> "RecurrentState":
        """An independent copy: O(state), whatever the history length."""
        return RecurrentState(self.gla.clone(), self.conv.clone(), self.n_tokens, dict(self.meta))

    def to(self, device: torch.device | str) -> "RecurrentState":
        return RecurrentState(self.gla.to(device), self.conv.to(device), self.n_tokens, dict(self.meta))

    # ---- batching -----------------------------------------------------------------------

    @classmethod
    def stack(cls, states: list["RecurrentState"]) -> "RecurrentState":
        """Join batch-1 (or any) states along the batch dimension."""
        if not states:
            raise ValueError("cannot stack an empty list of states")
        return cls(torch.cat([s.gla for s in states], dim=1), torch.cat([s.conv for s in states], dim=1))

    def select(self, index: int) -> "RecurrentState":
        """Row `index` as a batch-1 state (a copy)."""
        return RecurrentState(self.gla[:, index : index + 1].clone(), self.conv[:, index : index + 1].clone())

    def padded_to(self, batch: int) -> "RecurrentState":
        """Append zero rows up to `batch` (for fixed decode widths)."""
        extra = batch - self.batch_size
        if extra < 0:
            raise ValueError(f"state has {self.batch_size} rows, more than width {batch}")
        if extra == 0:
            return self
        zg = self.gla.new_zeros(self.gla.shape[0], extra, *self.gla.shape[2:])
        zc = self.conv.new_zeros(self.conv.shape[0], extra, *self.conv.shape[2:])
        return RecurrentState(torch.cat([self.gla, zg], 1), torch.cat([self.conv, zc], 1), self.n_tokens, dict(self.meta))

    def check_shape(self, config: LaplaceConfig) -> None:
        c = config
        want_gla = (c.n_layers, c.n_heads, c.head_k_dim, c.head_v_dim)
        want_conv = (c.n_layers, c.conv_dim, c.conv_size)
        got_gla = (self.gla.shape[0], *self.gla.shape[2:])
        got_conv = (self.conv.shape[0], *self.conv.shape[2:])
        if got_gla != want_gla or got_conv != want_conv:
            raise StateModelMismatchError(
                f"state shape gla{got_gla}/conv{got_conv} does not fit model {c.name} (gla{want_gla}/conv{want_conv}); "
                "replay the transcript into a fresh state"
            )

    # ---- bytes --------------------------------------------------------------------------

    def to_bytes(self, *, fingerprint: str, extra: dict[str, str] | None = None, architecture: str | None = None) -> bytes:
        """Serialize (batch 1 or more) with a checksum over the exact tensor bytes.
        `architecture` (`LaplaceConfig.architecture()`) names what the state's numbers mean."""
        gla = self.gla.detach().to("cpu", torch.float32).contiguous()
        conv = self.conv.detach().to("cpu", torch.float32).contiguous()
        meta = {
            "format": STATE_FORMAT,
            "format_version": str(STATE_FORMAT_VERSION),
            "layout": STATE_LAYOUT,
            "dtype": "float32",
            "fingerprint": fingerprint,
            "n_tokens": str(self.n_tokens),
            "checksum": _checksum(gla, conv),
            "extra": json.dumps(extra or {}, sort_keys=True),
        }
        if architecture is not None:
            meta["architecture"] = architecture
        return _safetensors_bytes({"conv": conv, "gla": gla}, meta)

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
        if set(tensors) != {"gla", "conv"}:
            raise StateCorruptError(f"state holds tensors {sorted(tensors)}, expected gla and conv; replay the transcript")
        gla, conv = tensors["gla"], tensors["conv"]
        if meta.get("checksum") != _checksum(gla, conv):
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
        state = cls(gla.to(device), conv.to(device), int(meta.get("n_tokens", "0")), meta)
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
    if meta.get("format_version") != str(STATE_FORMAT_VERSION):
        raise StateCorruptError(
            f"state format version {meta.get('format_version')} is not supported (expected {STATE_FORMAT_VERSION}); replay the transcript"
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
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(raw)]}
        payload.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # align the payload to 8 bytes, as the format allows
    return len(head).to_bytes(8, "little") + head + b"".join(payload)


def _checksum(gla: Tensor, conv: Tensor) -> str:
    h = hashlib.sha256()
    for t in (gla, conv):
        h.update(str(tuple(t.shape)).encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
