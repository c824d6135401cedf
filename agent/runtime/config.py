"""Model configuration: one frozen, keyword-only dataclass and a dict of named presets.

The `laplace-3b` preset reproduces i14's published Laplace 3B shape. Parameter and state
counts are derived here arithmetically (and checked against a meta-device build in tests),
so `laplace info` never has to allocate weights.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

CONFIG_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LaplaceConfig:
    """Architecture of a Laplace-family model (pure Simple-GLA decoder).

    Per layer: pre-norm -> causal depthwise conv (width `conv_size`) + SiLU -> q, k, v and a
    per-head scalar decay gate -> Simple GLA -> per-head RMSNorm -> output gate -> o, then a
    pre-norm GLU feed-forward. Each head keeps a `head_k_dim x head_v_dim` fp32 state.
    """

    name: str = "custom"
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    head_k_dim: int
    head_v_dim: int
    ffn_dim: int
    conv_size: int = 4
    chunk_size: int = 128
    norm_eps: float = 1e-6
    # Decay gate g = logsigmoid(w x + b) / gate_normalizer, with b set so the heads'
    # half-lives at init spread geometrically from half_life_min to half_life_max tokens.
    gate_normalizer: float = 16.0
    half_life_min: float = 1.0
    half_life_max: float = 2048.0
    init_std: float = 0.02
    format_version: int = CONFIG_FORMAT_VERSION
    # Derived in __post_init__ (not constructor arguments).
    key_dim: int = field(init=False)
    value_dim: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_k_dim", "head_v_dim", "ffn_dim", "conv_size", "chunk_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0 < self.half_life_min <= self.half_life_max:
            raise ValueError("need 0 < half_life_min <= half_life_max")
        if self.format_version != CONFIG_FORMAT_VERSION:
            raise ValueError(
                f"config format version {self.format_version} is not supported (this laplace reads {CONFIG_FORMAT_VERSION}); upgrade laplace"
            )
        object.__setattr__(self, "key_dim", self.n_heads * self.head_k_dim)
        object.__setattr__(self, "value_dim", self.n_heads * self.head_v_dim)

    # ---- derived quantities -------------------------------------------------------------

    def half_lives(self) -> list[float]:
        """Initial half-life in tokens of each head, geometric from min to max."""
        if self.n_heads == 1:
            return [self.half_life_min]
        ratio = self.half_life_max / self.half_life_min
        return [self.half_life_min * ratio ** (h / (self.n_heads - 1)) for h in range(self.n_heads)]

    def gate_biases(self) -> list[float]:
        """Bias per head so that logsigmoid(b) / normalizer = -ln2 / half_life at init."""
        return [-math.log(math.expm1(self.gate_normalizer * math.log(2.0) / h)) for h in self.half_lives()]

    def muon_parameters_per_layer(self) -> int:
        """2-D block matrices: q, k, v, output gate, o and the three GLU matrices."""
        d = self.d_model
        return 2 * d * self.key_dim + 3 * d * self.value_dim + 3 * d * self.ffn_dim

    def adamw_parameters_per_layer(self) -> int:
        """Two pre-norms, the depthwise conv, the grouped decay gate and the head norm."""
        d = self.d_model
        gate = self.n_heads * (d // self.n_heads) + self.n_heads
        return 2 * d + d * self.conv_size + gate + self.head_v_dim

    def muon_parameters(self) -> int:
        return self.n_layers * self.muon_parameters_per_layer()

    def adamw_parameters(self) -> int:
        return self.n_layers * self.adamw_parameters_per_layer() + 2 * self.vocab_size * self.d_model + self.d_model

    def parameters(self) -> int:
        return self.muon_parameters() + self.adamw_parameters()

    def state_bytes(self, batch: int = 1) -> int:
        """fp32 recurrent state: per layer the GLA matrices plus the conv cache."""
        gla = self.n_layers * self.n_heads * self.head_k_dim * self.head_v_dim * 4
        conv = self.n_layers * self.d_model * self.conv_size * 4
        return batch * (gla + conv)

    def kv_cache_bytes(self, tokens: int, bytes_per_value: int = 2) -> int:
        """A comparable softmax KV cache (K and V of width d_model per layer, bf16 default)."""
        return self.n_layers * 2 * self.d_model * tokens * bytes_per_value

    # ---- (de)serialization --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaplaceConfig":
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; this model needs a newer laplace")
        return cls(**data)

    def replace(self, **changes: Any) -> "LaplaceConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, LaplaceConfig] = {
    # i14's Laplace 3B: 24 x (3072 hidden, 16 heads of 96 x 192), GLU 8192, vocab 50,304.
    "laplace-3b": LaplaceConfig(
        name="laplace-3b", vocab_size=50304, d_model=3072, n_layers=24, n_heads=16,
        head_k_dim=96, head_v_dim=192, ffn_dim=8192,
    ),
    # A ~125M-parameter shape for GPU experiments.
    "laplace-125m": LaplaceConfig(
        name="laplace-125m", vocab_size=50304, d_model=768, n_layers=12, n_heads=8,
        head_k_dim=48, head_v_dim=96, ffn_dim=2048,
    ),
    # Sized for training on a 2-core CPU in about an hour (the bundled default's family).
    "laplace-small": LaplaceConfig(
        name="laplace-small", vocab_size=4096, d_model=256, n_layers=6, n_heads=8,
        head_k_dim=32, head_v_dim=64, ffn_dim=768, half_life_max=1024.0,
    ),
    # Tests: byte-level vocabulary, tiny widths, still several heads and a real schedule.
    "tiny": LaplaceConfig(
        name="tiny", vocab_size=264, d_model=64, n_layers=2, n_heads=4,
        head_k_dim=16, head_v_dim=32, ffn_dim=128, chunk_size=16, half_life_max=256.0,
    ),
}


def get_preset(name: str) -> LaplaceConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
