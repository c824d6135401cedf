"""The window mixer's state, as declared shapes, without torch: `window.WindowAttention`
declares it through here, and the torch-free `native.engine` allocates the same tensors.

A layer's tensors are stacked over the layers (layer at dim 0). The memory has up to two
groups of layers with their own slot counts: `memory_slots` in the layers `memory_layers`
names (every layer when it is empty), stacked as mem_k & co., and `memory_rest_slots` in the
layers it leaves out, stacked as rest_k & co. A layer reads its group's tensors under the
memory's own names (mem_k, ...): `layer_rows` says, per layer, which row of which stacked
tensor each of its names is."""

from __future__ import annotations

from typing import Any

StateSpec = dict[str, tuple[tuple[int, ...], str]]  # a mixer's per-layer state: name -> (shape, dtype)
WINDOW_USES_POSITIONS = True  # the window mixer reads `pos` (`WindowAttention.uses_positions`)
MEMORY_NAMES = ("mem_k", "mem_v", "mem_score", "mem_pos")  # the memory's tensors (`memory.py`), in the kernel's order
REST_NAMES = ("rest_k", "rest_v", "rest_score", "rest_pos")  # the same, stacked over the rest group's layers
MEMORY_GROUPS = (MEMORY_NAMES, REST_NAMES)  # every stacked memory tensor's name, by group
MEMORY_TENSORS = MEMORY_NAMES + REST_NAMES  # the same, in one tuple
MEMORY_DTYPE = "bfloat16"  # mem_k and mem_v: bf16 (half the bytes of fp32: twice the slots; perplexity the same to 3 decimals)
DTYPE_BYTES = {"float32": 4, "int64": 8, "bfloat16": 2}


def memory_layers(config: Any) -> tuple[int, ...]:
    """The layers that keep `memory_slots`: `config.memory_layers`, or every layer when that
    is empty; none without memory slots."""
    if not config.memory_slots:
        return ()
    return tuple(config.memory_layers) or tuple(range(config.n_layers))


def rest_layers(config: Any) -> tuple[int, ...]:
    """The layers that keep `memory_rest_slots`: those `memory_layers` leaves out."""
    if not config.memory_slots or not config.memory_rest_slots or not config.memory_layers:
        return ()
    return tuple(i for i in range(config.n_layers) if i not in config.memory_layers)


def group_layers(config: Any) -> list[tuple[tuple[str, ...], int, tuple[int, ...]]]:
    """(stacked names, slots, layers) of each memory group that has layers."""
    groups = [(MEMORY_NAMES, config.memory_slots, memory_layers(config)), (REST_NAMES, config.memory_rest_slots, rest_layers(config))]
    return [g for g in groups if g[2]]


def memory_slots_of(config: Any, layer: int) -> int:
    """M of layer `layer`'s memory (0: it keeps none)."""
    return next((slots for _, slots, layers in group_layers(config) if layer in layers), 0)


def memory_spec(config: Any, batch: int, slots: int) -> StateSpec:
    """mem_k, mem_v [B, G, M, D] bf16 (keys un-rotated), mem_score [B, G, M], mem_pos [B, G, M]
    (1 + the absolute position of each slot's token, EMPTY if none); nothing when M = 0."""
    M = slots
    if not M:
        return {}
    B, G, D = batch, config.kv_heads, config.head_k_dim
    return {"mem_k": ((B, G, M, D), MEMORY_DTYPE), "mem_v": ((B, G, M, D), MEMORY_DTYPE),
            "mem_score": ((B, G, M), "float32"), "mem_pos": ((B, G, M), "int64")}


def window_state_spec(config: Any, batch: int, layer: int = 0) -> StateSpec:
    """Layer `layer`'s: win_k, win_v [B, G, S + W, D]; gla [B, H, F, D + 1] with the branch;
    the memory's, with its group's slots (none in a layer without one)."""
    c = config
    ring = (batch, c.kv_heads, c.sinks + c.window, c.head_k_dim)
    spec = {"win_k": (ring, "float32"), "win_v": (ring, "float32")}
    if c.gla_branch:
        spec["gla"] = ((batch, c.n_heads, c.feature_size, c.head_v_dim + 1), "float32")
    return spec | memory_spec(c, batch, memory_slots_of(c, layer))


def stacked_window_spec(config: Any, batch: int) -> StateSpec:
    """`window_state_spec` stacked: each memory group's tensors over its layers, the rest
    over all layers."""
    spec = {n: ((config.n_layers, *shape), dtype) for n, (shape, dtype) in window_state_spec(config, batch).items()
            if n not in MEMORY_NAMES}
    for names, slots, layers in group_layers(config):
        for name, (shape, dtype) in zip(names, memory_spec(config, batch, slots).values()):
            spec[name] = ((len(layers), *shape), dtype)
    return spec


def layer_rows(config: Any, names: Any) -> list[dict[str, tuple[str, int]]]:
    """Per layer, {name the layer reads: (stacked tensor, row)} for the stacked tensors in
    `names` (a memory group's only in its layers, read as mem_k & co.)."""
    names = list(names)
    out: list[dict[str, tuple[str, int]]] = [{n: (n, i) for n in names if not any(n in g for g in MEMORY_GROUPS)}
                                             for i in range(config.n_layers)]
    for group, _, layers in group_layers(config):
        for row, i in enumerate(layers):
            out[i].update({own: (n, row) for own, n in zip(MEMORY_NAMES, group) if n in names})
    return out
