"""The window mixer's state, as declared shapes, without torch: `window.WindowAttention`
declares it through here, and the torch-free `native.engine` allocates the same tensors."""

from __future__ import annotations

from typing import Any

StateSpec = dict[str, tuple[tuple[int, ...], str]]  # a mixer's per-layer state: name -> (shape, dtype)
WINDOW_USES_POSITIONS = True  # the window mixer reads `pos` (`WindowAttention.uses_positions`)


def memory_spec(config: Any, batch: int) -> StateSpec:
    """mem_k, mem_v [B, G, M, D] (keys un-rotated), mem_score [B, G, M], mem_pos [B, G, M]
    (1 + the absolute position of each slot's token, EMPTY if none); nothing when M = 0."""
    M = config.memory_slots
    if not M:
        return {}
    B, G, D = batch, config.kv_heads, config.head_k_dim
    return {"mem_k": ((B, G, M, D), "float32"), "mem_v": ((B, G, M, D), "float32"),
            "mem_score": ((B, G, M), "float32"), "mem_pos": ((B, G, M), "int64")}


def window_state_spec(config: Any, batch: int) -> StateSpec:
    """win_k, win_v [B, G, S + W, D]; gla [B, H, F, D + 1] with the branch; the memory's."""
    c = config
    ring = (batch, c.kv_heads, c.sinks + c.window, c.head_k_dim)
    spec = {"win_k": (ring, "float32"), "win_v": (ring, "float32")}
    if c.gla_branch:
        spec["gla"] = ((batch, c.n_heads, c.feature_size, c.head_v_dim + 1), "float32")
    return spec | memory_spec(c, batch)
