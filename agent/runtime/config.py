"""Model configuration: one frozen, keyword-only dataclass and a dict of named presets.

The `laplace-3b` preset reproduces i14's published Laplace 3B shape. Parameter and state
counts are derived here arithmetically (and checked against a meta-device build in tests),
so `laplace info` never has to allocate weights.

Two token mixers share the one Simple-GLA kernel (`gla.py`):

- `mixer="gla"`: the Laplace mixer (conv over the hidden state, q/k/v projections, a
  logsigmoid decay gate per head, head norm and output gate).
- `mixer="ssd"`: the Mamba-2 mixer family as imported from public checkpoints (Llamba,
  Mamba2ForCausalLM): one in_proj to (z, x, B, C, a), a conv over (x, B, C), decay
  g = -exp(A_log) * softplus(a + dt_bias), k = B and q = C shared by groups of value heads,
  v = x (times dt where `v_times_dt`), y = C S + D x, then a gate. Its switches below say
  which member of the family a checkpoint is; the state is still [H, K, V] per layer.

A third mixer, `mixer="window"` (`window.py`), is the hybrid a Llama teacher converts to:
the teacher's q/k/v/o with softmax attention over `sinks` + the last `window` tokens (a
fixed ring buffer of keys and values), plus optionally a Simple-GLA branch over the keys
that left the window. Its state is the ring, the GLA matrices and a position per row.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

CONFIG_FORMAT_VERSION = 1
MEMORY_POLICIES = ("recall", "attention", "novelty")  # how the window's memory scores evicted tokens (memory.py)


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
    # ---- architecture switches (defaults are the Laplace mixer) -------------------------
    mixer: str = "gla"  # "gla" | "ssd"
    n_qk_heads: int = 0  # q/k heads shared by groups of value heads (0: one per value head)
    qk_scale: bool = True  # q * head_k_dim ** -0.5 (Mamba-2 uses no scale)
    d_skip: bool = False  # y += D * x per head (ssd)
    v_times_dt: bool = False  # v = x * dt, Mamba-2's discretization (ssd)
    gate: str = "headnorm"  # "headnorm" (gla) | "silu" (y * silu(z + z_bias)) | "rmsnorm" (grouped gated RMSNorm)
    norm_groups: int = 1  # groups of the gated RMSNorm
    conv_activation: str = "silu"  # "silu" | "identity", after the conv
    conv_bias: bool = False
    proj_bias: bool = False  # bias on the ssd in_proj / out_proj
    dt_min: float = 0.0  # Mamba-2's time_step_limit on dt = softplus(a + dt_bias)
    dt_max: float | None = None
    tie_embeddings: bool = False
    final_norm_eps: float | None = None  # None: norm_eps
    # ---- the window mixer (a converted Llama teacher; ignored by the others) ------------
    n_kv_heads: int = 0  # key/value heads shared by groups of query heads (GQA)
    rope_theta: float = 10000.0
    window: int = 0  # W: the most recent tokens attended with softmax
    sinks: int = 0  # S: the first tokens of the stream, attended always
    gla_branch: bool = False  # Simple GLA over the keys evicted from the window
    feature_map: str = "hedgehog"  # "hedgehog": softmax(xW) ++ softmax(-xW); "elu": elu(x) + 1
    feature_dim: int = 0  # columns of the hedgehog map (0: the head dim); its features are twice that
    combine: str = "softmax"  # "softmax": one normalisation (LoLCATs); "gated": window + gate * GLA
    memory_slots: int = 0  # M: evicted tokens kept per layer and kv head, read with the window (0: none)
    memory_policy: str = "recall"  # which evicted tokens it keeps: "recall" (LoLA), "attention" (TOVA) or "novelty"
    memory_layers: tuple[int, ...] = ()  # the layers that keep the memory, ascending (empty: every layer)
    memory_rest_slots: int = 0  # evicted tokens kept per kv head in the layers memory_layers leaves out (0: none)
    memory_distance: int = 0  # the RoPE distance the window reads the memory at (0: W, just past its edge)
    memory_rest_distance: int = 0  # the same for the layers memory_layers leaves out (0: as memory_distance)
    format_version: int = CONFIG_FORMAT_VERSION
    # Derived in __post_init__ (not constructor arguments).
    key_dim: int = field(init=False)
    value_dim: int = field(init=False)
    conv_dim: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_k_dim", "head_v_dim", "conv_size", "chunk_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.ffn_dim < 0 or self.n_qk_heads < 0:
            raise ValueError("ffn_dim and n_qk_heads must be >= 0 (0: no feed-forward / one q-k head per value head)")
        if self.format_version != CONFIG_FORMAT_VERSION:
            raise ValueError(
                f"config format version {self.format_version} is not supported (this laplace reads {CONFIG_FORMAT_VERSION}); upgrade laplace"
            )
        choices = {"mixer": ("gla", "ssd", "window"), "gate": ("headnorm", "silu", "rmsnorm"), "conv_activation": ("silu", "identity"),
                   "feature_map": ("hedgehog", "elu"), "combine": ("softmax", "gated"), "memory_policy": MEMORY_POLICIES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"config field {name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        n_qk = self.qk_heads
        if self.n_heads % n_qk:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_qk_heads ({n_qk})")
        if self.mixer == "gla":
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
            if not 0 < self.half_life_min <= self.half_life_max:
                raise ValueError("need 0 < half_life_min <= half_life_max")
            if n_qk != self.n_heads or self.gate != "headnorm" or self.d_skip or self.v_times_dt:
                raise ValueError("the gla mixer has one q-k head per value head, the headnorm gate, no D skip and no dt")
        elif self.mixer == "window":
            self._check_window()
        elif self.gate == "headnorm":
            raise ValueError("the ssd mixer takes gate 'silu' or 'rmsnorm'")
        if self.gate == "rmsnorm" and (self.n_heads * self.head_v_dim) % self.norm_groups:
            raise ValueError(f"norm_groups ({self.norm_groups}) must divide the inner width {self.n_heads * self.head_v_dim}")
        object.__setattr__(self, "key_dim", n_qk * self.head_k_dim)
        object.__setattr__(self, "value_dim", self.n_heads * self.head_v_dim)
        conv_dim = {"gla": self.d_model, "ssd": self.value_dim + 2 * self.key_dim, "window": 0}[self.mixer]
        object.__setattr__(self, "conv_dim", conv_dim)

    def _check_window(self) -> None:
        if self.head_k_dim != self.head_v_dim or self.head_k_dim % 2:
            raise ValueError("the window mixer has one even head dim: head_k_dim == head_v_dim")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        if self.window <= 0 or self.sinks < 0 or self.feature_dim < 0 or self.rope_theta <= 0 or self.memory_slots < 0:
            raise ValueError("the window mixer needs window >= 1, sinks >= 0, feature_dim >= 0, memory_slots >= 0 and rope_theta > 0")
        object.__setattr__(self, "memory_layers", tuple(int(i) for i in self.memory_layers))  # JSON gives a list
        if list(self.memory_layers) != sorted(set(self.memory_layers)) or any(not 0 <= i < self.n_layers for i in self.memory_layers):
            raise ValueError(f"memory_layers must be distinct layer indices 0..{self.n_layers - 1} in ascending order, "
                             f"got {list(self.memory_layers)}")
        if self.memory_rest_slots < 0 or (self.memory_rest_slots and not (self.memory_slots and self.memory_layers)):
            raise ValueError("memory_rest_slots keeps a memory in the layers memory_layers leaves out: it needs memory_slots "
                             "and memory_layers, and is >= 0")
        for name in ("memory_distance", "memory_rest_distance"):
            d = getattr(self, name)
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                same = f"the window, {self.window}" if name == "memory_distance" else "as memory_distance"
                raise ValueError(f"{name} is the RoPE distance the memory is read at: give 0 ({same}) "
                                 f"or a number of tokens >= 1, got {d!r}")
        if self.memory_rest_distance and not self.memory_rest_slots:
            raise ValueError("memory_rest_distance is where the layers memory_layers leaves out read their memory: "
                             "it needs memory_rest_slots")
        if self.memory_slots and self.memory_policy == "recall" and not self.gla_branch:
            raise ValueError("memory_policy 'recall' scores tokens by the GLA branch's recall error; turn gla_branch on or use 'attention' or 'novelty'")
        if not 0 < self.half_life_min <= self.half_life_max:
            raise ValueError("need 0 < half_life_min <= half_life_max")
        if (self.n_qk_heads or not self.qk_scale or self.d_skip or self.v_times_dt or self.gate != "headnorm"
                or self.conv_bias or self.proj_bias):
            raise ValueError("the window mixer has no q-k groups, conv, D skip, dt, output gate or projection bias; leave those switches unset")

    # ---- derived quantities -------------------------------------------------------------

    @property
    def qk_heads(self) -> int:
        return self.n_qk_heads or self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the window mixer (GQA groups)."""
        return self.n_kv_heads or self.n_heads

    @property
    def memory_read_at(self) -> int:
        """The RoPE distance the window's softmax reads the memory's un-rotated keys at:
        `memory_distance`, or W when it is 0. The same at every step, so no angle grows with
        the session; not part of `architecture()`: the memory holds the same bytes either way."""
        return self.memory_distance or self.window

    def memory_read_at_layer(self, layer: int) -> int:
        """`memory_read_at` for layer `layer`: `memory_rest_distance` (when set) in the layers
        `memory_layers` leaves out, which keep `memory_rest_slots`; `memory_read_at` elsewhere."""
        rest = self.memory_rest_distance and self.memory_layers and layer not in self.memory_layers
        return self.memory_rest_distance if rest else self.memory_read_at

    @property
    def feature_size(self) -> int:
        """Width of the GLA branch's feature map phi(q), phi(k) (the branch state's key dim)."""
        if self.feature_map == "elu":
            return self.head_k_dim
        return 2 * (self.feature_dim or self.head_k_dim)

    def architecture(self) -> str:
        """A short id of everything that decides the state's meaning (recorded in each
        saved state, so a state from another architecture is refused by name)."""
        c = self
        if c.mixer == "window":
            parts = ["window", f"L{c.n_layers}", f"H{c.n_heads}x{c.head_k_dim}", f"KV{c.kv_heads}", f"W{c.window}", f"S{c.sinks}"]
            branch = f"gla-{c.feature_map}{c.feature_size}-{c.combine}" if c.gla_branch else "nogla"
            if c.memory_slots:  # bf16 slots (a state of the fp32 ones, which named no memory here, is refused by name)
                layers = "+".join(map(str, c.memory_layers)) or "all"
                branch += f"/mem{c.memory_slots}-{c.memory_policy}-bf16-layers{layers}"
                if c.memory_rest_slots:  # a second group: the other layers' own slot count
                    branch += f"-rest{c.memory_rest_slots}"
            return "/".join(parts + [branch])
        parts = [c.mixer, f"L{c.n_layers}", f"H{c.n_heads}x{c.head_k_dim}x{c.head_v_dim}", f"G{c.qk_heads}", f"conv{c.conv_dim}x{c.conv_size}"]
        if c.mixer == "ssd":
            parts.append("vdt" if c.v_times_dt else "v")
        return "/".join(parts)

    def half_lives(self) -> list[float]:
        """Initial half-life in tokens of each head, geometric from min to max (gla mixer and
        the window mixer's GLA branch; an ssd mixer's decays have no schedule, so it has none)."""
        if self.mixer == "ssd" or (self.mixer == "window" and not self.gla_branch):
            return []
        if self.n_heads == 1:
            return [self.half_life_min]
        ratio = self.half_life_max / self.half_life_min
        return [self.half_life_min * ratio ** (h / (self.n_heads - 1)) for h in range(self.n_heads)]

    def gate_biases(self) -> list[float]:
        """Bias per head so that logsigmoid(b) / normalizer = -ln2 / half_life at init."""
        return [-math.log(math.expm1(self.gate_normalizer * math.log(2.0) / h)) for h in self.half_lives()]

    def in_proj_dim(self) -> int:
        """Rows of the ssd in_proj: z, x, B, C and the decay input a (one per value head)."""
        return 2 * self.value_dim + 2 * self.key_dim + self.n_heads

    def muon_parameters_per_layer(self) -> int:
        """2-D block matrices: q, k, v, output gate, o (or in_proj, out_proj) and the GLU."""
        d = self.d_model
        glu = 3 * d * self.ffn_dim
        if self.mixer == "window":
            kv = self.kv_heads * self.head_k_dim
            return 2 * d * self.key_dim + 2 * d * kv + glu  # q and o, k and v
        if self.mixer == "ssd":
            return d * self.in_proj_dim() + self.value_dim * d + glu
        return 2 * d * self.key_dim + 3 * d * self.value_dim + glu

    def adamw_parameters_per_layer(self) -> int:
        """Pre-norms, the depthwise conv, the decay gate, head norm / gate, biases, D."""
        d = self.d_model
        norms = d + (d if self.ffn_dim else 0)
        if self.mixer == "window":
            return norms + self.branch_parameters_per_layer()
        conv = self.conv_dim * self.conv_size + (self.conv_dim if self.conv_bias else 0)
        if self.mixer == "ssd":
            bias = self.in_proj_dim() + d if self.proj_bias else 0
            skip = self.n_heads if self.d_skip else 0
            return norms + conv + bias + 2 * self.n_heads + skip + self.value_dim  # A_log, dt_bias, D, z_bias/norm
        gate = self.n_heads * (d // self.n_heads) + self.n_heads
        return norms + conv + gate + self.head_v_dim

    def branch_parameters_per_layer(self) -> int:
        """The window mixer's GLA branch: hedgehog maps for q and k [H, D, F] each, the decay
        gate (weight [H, d_model], bias [H]) and the per-head mixing weight [H]."""
        if self.mixer != "window" or not self.gla_branch:
            return 0
        H = self.n_heads
        maps = 2 * H * self.head_k_dim * (self.feature_dim or self.head_k_dim) if self.feature_map == "hedgehog" else 0
        return maps + H * self.d_model + H + H

    def muon_parameters(self) -> int:
        return self.n_layers * self.muon_parameters_per_layer()

    def adamw_parameters(self) -> int:
        heads = 1 if self.tie_embeddings else 2
        return self.n_layers * self.adamw_parameters_per_layer() + heads * self.vocab_size * self.d_model + self.d_model

    def parameters(self) -> int:
        return self.muon_parameters() + self.adamw_parameters()

    def state_spec(self, batch: int = 1) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every tensor of the recurrent state: name -> (shape, dtype), batch at dim 1, in
        the order a saved state's layout lists them: each layer's tensors as the mixer
        declares them (`mixers.py`), stacked over layers, then pos [1, B] (tokens read so
        far by each row) if the mixer uses positions.

        gla and ssd: gla [L, B, H, K, V] and the conv cache [L, B, conv_dim, conv_size].
        window: the ring win_k / win_v [L, B, G, S + W, D] (keys rotated to their slot's
        angle; slots < S are the sinks), the branch's gla [L, B, H, F, D + 1] (the extra
        column sums the normaliser) if it is on, the memory's [L_mem, B, G, M, ...] over the
        layers that keep one (mem_k & co., and rest_k & co. for `memory_rest_slots`; `state_spec`), and pos."""
        if self.mixer == "window":  # declared torch-free (state_spec.py): the engine's process reads it too
            from agent.runtime.state_spec import WINDOW_USES_POSITIONS, stacked_window_spec

            spec = stacked_window_spec(self, batch)
            if WINDOW_USES_POSITIONS:
                spec["pos"] = ((1, batch), "int64")  # state.POSITIONS: the model's, no layer dimension
            return spec
        else:
            # The mixers declare their state and import this module, so their table is looked
            # up when asked, by name (a registry read at call time: no import cycle at load time).
            mixer = importlib.import_module("agent.runtime.mixers").MIXERS[self.mixer]
            layer, uses_positions = mixer.state_spec(self, batch), mixer.uses_positions
        spec = {name: ((self.n_layers, *shape), dtype) for name, (shape, dtype) in layer.items()}
        if uses_positions:
            spec["pos"] = ((1, batch), "int64")  # state.POSITIONS: the model's, no layer dimension
        return spec

    def state_bytes(self, batch: int = 1) -> int:
        """Bytes of the recurrent state: gla + conv cache, or ring + branch + positions."""
        from agent.runtime.state_spec import DTYPE_BYTES

        return sum(math.prod(shape) * DTYPE_BYTES[dtype] for shape, dtype in self.state_spec(batch).values())

    def kv_cache_bytes(self, tokens: int, bytes_per_value: int = 2) -> int:
        """A comparable softmax KV cache (K and V of width d_model per layer, or of the
        kv heads' width for the window mixer's teacher; bf16 default)."""
        width = self.kv_heads * self.head_k_dim if self.mixer == "window" else self.d_model
        return self.n_layers * 2 * width * tokens * bytes_per_value

    # ---- (de)serialization --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The init fields; architecture switches left at their defaults are omitted, so a
        Laplace model's config.json (and so its fingerprint) is the same as before they existed.
        A window model writes all of its own fields: a later default cannot change its meaning."""
        out = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name in _SWITCHES and value == f.default and not (self.mixer == "window" and f.name in _WINDOW_FIELDS):
                continue
            out[f.name] = value
        return out

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


_SWITCHES = frozenset(
    ("mixer", "n_qk_heads", "qk_scale", "d_skip", "v_times_dt", "gate", "norm_groups", "conv_activation",
     "conv_bias", "proj_bias", "dt_min", "dt_max", "tie_embeddings", "final_norm_eps",
     "n_kv_heads", "rope_theta", "window", "sinks", "gla_branch", "feature_map", "feature_dim", "combine",
     "memory_slots", "memory_policy", "memory_layers", "memory_rest_slots", "memory_distance",
     "memory_rest_distance")
)


_WINDOW_FIELDS = frozenset(("mixer", "n_kv_heads", "rope_theta", "window", "sinks", "gla_branch", "feature_map", "feature_dim", "combine"))


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
    # The imported family at 1B: Llama-3.2-1B widths on the Mamba-2 mixer (as Llamba-1B is
    # built). A shape for `laplace info` and `laplace bench cpu1b`; an import reads the real
    # checkpoint's own config.json.
    "ssd-1b": LaplaceConfig(
        name="ssd-1b", vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, head_k_dim=64, head_v_dim=64,
        ffn_dim=8192, mixer="ssd", qk_scale=False, d_skip=True, gate="silu", conv_activation="identity",
        conv_bias=True, norm_eps=1e-5,
    ),
    # SmolLM2-135M's shape as a window hybrid (what `laplace import` makes of its GGUF), for
    # `laplace info`; an import reads the real checkpoint's own numbers.
    "smollm2-135m-window": LaplaceConfig(
        name="smollm2-135m-window", vocab_size=49152, d_model=576, n_layers=30, n_heads=9, head_k_dim=64,
        head_v_dim=64, ffn_dim=1536, chunk_size=64, norm_eps=1e-5, tie_embeddings=True, mixer="window",
        n_kv_heads=3, rope_theta=100000.0, window=256, sinks=4, gla_branch=True, half_life_min=64.0,
        half_life_max=8192.0,
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
