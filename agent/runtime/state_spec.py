"""The window mixer's state, as declared shapes, without torch: `window.WindowAttention`
declares it through here, and the torch-free `native.engine` allocates the same tensors.

A layer's tensors are stacked over the layers (layer at dim 0), the memory's over the layers
that keep one (`memory_layers`): layer i's memory is row `memory_layers(c).index(i)` of
mem_k & co. `layer_rows` says, per layer, which row of each stacked tensor it owns."""

from __future__ import annotations

from typing import Any

StateSpec = dict[str, tuple[tuple[int, ...], str]]  # a mixer's per-layer state: name -> (shape, dtype)
WINDOW_USES_POSITIONS = True  # the window mixer reads `pos` (`WindowAttention.uses_positions`)
MEMORY_NAMES = ("mem_k", "mem_v", "mem_score", "mem_pos")  # the memory's tensors (`memory.py`), in the kernel's order
MEMORY_DTYPE = "bfloat16"  # mem_k and mem_v: bf16 (half the bytes of fp32: twice the slots; perplexity the same to 3 decimals)
DTYPE_BYTES = {"float32": 4, "int64": 8, "bfloat16": 2}


def memory_layers(config: Any) -> tuple[int, ...]:
    """The layers that keep a memory: `config.memory_layers`, or every layer when that is
    empty; none without memory slots."""
    if not config.memory_slots:
        return ()
    return tuple(config.memory_layers) or tuple(range(config.n_layers))


def memory_spec(config: Any, batch: int) -> StateSpec:
    """mem_k, mem_v [B, G, M, D] bf16 (keys un-rotated), mem_score [B, G, M], mem_pos [B, G, M]
    (1 + the absolute position of each slot's token, EMPTY if none); nothing when M = 0."""
    M = config.memory_slots
    if not M:
        return {}
    B, G, D = batch, config.kv_heads, config.head_k_dim
    return {"mem_k": ((B, G, M, D), MEMORY_DTYPE), "mem_v": ((B, G, M, D), MEMORY_DTYPE),
            "mem_score": ((B, G, M), "float32"), "mem_pos": ((B, G, M), "int64")}


def window_state_spec(config: Any, batch: int) -> StateSpec:
    """One layer's: win_k, win_v [B, G, S + W, D]; gla [B, H, F, D + 1] with the branch; the
    memory's (in the layers that keep one)."""
    c = config
    ring = (batch, c.kv_heads, c.sinks + c.window, c.head_k_dim)
    spec = {"win_k": (ring, "float32"), "win_v": (ring, "float32")}
    if c.gla_branch:
        spec["gla"] = ((batch, c.n_heads, c.feature_size, c.head_v_dim + 1), "float32")
    return spec | memory_spec(c, batch)


def stacked_window_spec(config: Any, batch: int) -> StateSpec:
    """`window_state_spec` stacked: the memory's tensors over the memory layers, the rest over
    all layers."""
    n_mem = len(memory_layers(config))
    return {n: ((n_mem if n in MEMORY_NAMES else config.n_layers, *shape), dtype)
            for n, (shape, dtype) in window_state_spec(config, batch).items()}


def layer_rows(config: Any, names: Any) -> list[dict[str, int]]:
    """Per layer, the row of each stacked tensor in `names` it owns (a memory tensor only in
    the layers that keep one)."""
    rows = {layer: r for r, layer in enumerate(memory_layers(config))}
    return [{n: rows[i] if n in MEMORY_NAMES else i for n in names if n not in MEMORY_NAMES or i in rows}
            for i in range(config.n_layers)]
