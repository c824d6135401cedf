"""A whole batch-1 decode step of a window-mixer model in few calls: torch runs the matmuls,
`decode.c` everything between them (issue 35).

Per layer a step is eight calls: add+norm (C), q/k/v (one matmul), the window mixer (C),
o_proj, add+norm (C), gate/up (one matmul), silu*up (C), down; then the final norm (C) and
the LM head. `LaplaceModel.step_`'s torch step (which stays the reference) made ~390 aten
calls per layer on the default model, and their dispatch cost more than the arithmetic.
`forward` is a batch-1 prefill: the matmuls over all rows, the mixer token by token in C.

With int8 weights the matmuls are `torch._weight_int8pack_mm` on bf16 activations, their
outputs bf16 and scaled per channel afterwards, as `quant.Int8Linear` does for a decode
row; the C kernels read and write that form directly, so no activation is converted by a
torch op. With fp32 weights everything is fp32.

`plan_for(model, state)` says whether a step can take this path, and builds the plan once;
it is checked (the same modules and weights, no hooks) on every step, so a LoRA wrapper, a replaced
weight or a probe's hook sends the step back to the torch path. Models it does not cover
(a memory other than "novelty", other mixers, a half-precision model, a GPU) take the torch
path too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime import native
from agent.runtime.layers import GLU, RMSNorm, fused_group
from agent.runtime.quant import Int8Embedding, Int8Linear, _ones_bf16
from agent.runtime.window_decode import kernels_may_run, native_memory_ok, native_state_ok, run_window, step_tables


@dataclass
class Matmul:
    """One (possibly fused) bias-free projection: int8 rows + scales, or an fp32 matrix."""

    weight: Tensor
    scale: Tensor | None  # int8 only
    ones: Tensor | None = None  # int8: the kernel's unit scales (the real ones are applied by the next C call)
    module: Int8Linear | None = None  # int8: its Linear, whose forward a prefill's many rows take

    def __call__(self, x: Tensor) -> Tensor:
        """One decode row: bf16 in and out for int8 (scaled by the next C call), else fp32."""
        if self.scale is not None:
            return torch._weight_int8pack_mm(x, self.weight, self.ones)
        return F.linear(x, self.weight)

    def rows(self, x: Tensor) -> Tensor:
        """Any number of fp32 rows, fp32 out: `Int8Linear.forward`, or the fp32 matmul."""
        return self.module(x) if self.module is not None else F.linear(x, self.weight)

    def scale_ptr(self) -> int | None:
        return None if self.scale is None else self.scale.data_ptr()


@dataclass
class LayerPlan:
    attn_norm: RMSNorm
    ffn_norm: RMSNorm
    attn: Any  # window.WindowAttention
    qkv: Matmul
    o: Matmul
    gate_up: Matmul
    down: Matmul


@dataclass
class Plan:
    int8: bool
    layers: list[LayerPlan]
    head: Matmul
    modules: list[nn.Module]  # every module a torch step would call: a hook on one sends the step there


def _matmul(owner: nn.Module, names: tuple[str, ...], int8: bool) -> Matmul | None:
    """The projection `names` of `owner` as one matrix: a fused group still valid
    (`layers.fused_group`) or a single Linear of the expected kind; None otherwise."""
    if len(names) == 1:
        return _linear(getattr(owner, names[0]), int8)
    group = fused_group(owner, names)
    return None if group is None else _linear(group[0], int8)


def _linear(mod: Any, int8: bool) -> Matmul | None:
    if int8 and type(mod) is Int8Linear and mod.bias is None:
        w = mod.weight
        # _weight_int8pack_mm's vector loops (the Int8Linear decode row's path) need K % 16 == 0 and aligned rows.
        if w.is_contiguous() and w.shape[1] % 16 == 0 and w.data_ptr() % 16 == 0:
            return Matmul(w, mod.scale.contiguous(), _ones_bf16(w.shape[0]), mod)
        return None
    if not int8 and isinstance(mod, Tensor):  # a fused fp32 group is its matrix
        return Matmul(mod, None) if mod.dtype == torch.float32 else None
    if not int8 and type(mod) is nn.Linear and mod.bias is None and mod.weight.dtype == torch.float32:
        return Matmul(mod.weight, None)
    return None


# What a step reads, by attribute: a plan holds (holder, name, value) for each, and is good while
# every owner.name is still that value (a LoRA wrapper, a new weight or a replaced
# norm changes one). Values are read live each step, so weights changed in place are seen.
WATCHED = {
    "block": ("attn", "ffn", "attn_norm", "ffn_norm"),
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj", "gla_branch", "decay_tap"),
    "ffn": ("w1", "w2", "w3"),
}


def _watch(owner: Any, names: tuple[str, ...]) -> list[tuple[dict, str, Any]]:
    """(the dict that holds owner.name, name, its value) for each name: a Module keeps
    parameters, buffers and children in dicts of their own, read here without the slow
    Module.__getattr__ (~1 us a read; a step checks ~900 of them)."""
    if owner is None:
        return []
    out = []
    for n in names:
        holder = next((d for d in (owner._parameters, owner._buffers, owner._modules) if n in d), owner.__dict__) \
            if isinstance(owner, nn.Module) else owner.__dict__
        out.append((holder, n, holder.get(n)))
    return out


def _watch_model(model: nn.Module) -> list[tuple[dict, str, Any]]:
    watched = _watch(model, ("embed", "norm", "lm_head", "blocks")) + _watch(model.blocks, tuple(model.blocks._modules))
    for block in model.blocks:
        attn, ffn = block.attn, block.ffn
        watched += _watch(block, WATCHED["block"]) + _watch(attn, WATCHED["attn"]) + _watch(ffn, WATCHED["ffn"])
        mats = [getattr(attn, n, None) for n in WATCHED["attn"][:4]] + [getattr(ffn, n, None) for n in WATCHED["ffn"]]
        for m in [block.attn_norm, block.ffn_norm, *mats]:
            watched += _watch(m, ("weight", "scale"))
    for m in (model.norm, model.embed, model.lm_head):
        watched += _watch(m, ("weight", "scale"))
    return watched


def _unchanged(watched: list[tuple[dict, str, Any]]) -> bool:
    return all(d.get(n) is v for d, n, v in watched)


def build_plan(model: nn.Module) -> Plan | None:
    c = model.config
    if c.mixer != "window" or not native_memory_ok(c) or not c.ffn_dim or c.head_k_dim != c.head_v_dim:
        return None
    int8 = type(model.embed) is Int8Embedding
    if not int8 and (type(model.embed) is not nn.Embedding or model.embed.weight.dtype != torch.float32):
        return None
    if model.embed.weight.device.type != "cpu" or type(model.norm) is not RMSNorm or model.norm.weight.dtype != torch.float32:
        return None
    layers = []
    for block in model.blocks:
        attn, ffn = block.attn, block.ffn
        norms = (block.attn_norm, block.ffn_norm)
        if type(ffn) is not GLU or any(type(n) is not RMSNorm or n.weight.dtype != torch.float32 for n in norms):
            return None
        mats = [_matmul(attn, attn.FUSED, int8), _matmul(attn, ("o_proj",), int8),
                _matmul(ffn, GLU.FUSED, int8), _matmul(ffn, ("w2",), int8)]
        if any(m is None for m in mats):
            return None
        layers.append(LayerPlan(block.attn_norm, block.ffn_norm, attn, *mats))  # type: ignore[arg-type]
    if model.lm_head is not None:
        head = _linear(model.lm_head, int8)
    else:  # a tied fp32 head reads the embedding (column-major in the decode layout: F.linear takes either)
        head = None if int8 else Matmul(model.embed.weight, None)
    if head is None:
        return None
    return Plan(int8, layers, head, list(model.modules()))


def plan_for(model: nn.Module, state: Any) -> Plan | None:
    """The model's plan if its step can run here now on `state` (built once, then checked), else None."""
    if not kernels_may_run():
        return None
    if state.batch_size != 1 or not native_state_ok(state.layer_tensors):
        return None
    lib = native.library()
    if lib is None:
        return None
    entry = model.__dict__.get("_native_plan")  # (what the plan read, the plan or None: this model cannot)
    if entry is None or not _unchanged(entry[0]):
        entry = (_watch_model(model), build_plan(model))
        model.__dict__["_native_plan"] = entry
    plan = entry[1]
    if plan is None or any(m._forward_hooks or m._forward_pre_hooks for m in plan.modules):
        return None
    return plan


def step_(plan: Plan, model: nn.Module, tokens: Tensor, state: Any) -> Tensor:
    """`LaplaceModel.step_` for one row through the plan: logits [1, vocab], `state` advanced in place."""
    lib = native.library()
    c = model.config
    d, f = c.d_model, c.ffn_dim
    bf = int(plan.int8)
    act = torch.bfloat16 if plan.int8 else torch.float32
    # This step's activations (fresh each step: two threads may step one model's two sessions).
    x = model.embed(tokens).float().contiguous()
    h, h_mm = torch.empty(1, d), torch.empty(1, d, dtype=act)
    y, a = torch.empty(1, c.n_heads * c.head_v_dim, dtype=act), torch.empty(1, f, dtype=act)
    t = int(state.positions)
    xp, hp, hmp, ap = x.data_ptr(), h.data_ptr(), h_mm.data_ptr(), a.data_ptr()
    prev: Tensor | None = None
    prev_scale = None
    for lp, layer in zip(plan.layers, state.layer_views(c)):
        lib.laplace_add_norm(xp, None if prev is None else prev.data_ptr(), bf, prev_scale, d,
                             lp.attn_norm.weight.data_ptr(), lp.attn_norm.eps, hp, hmp, bf)
        qkv = lp.qkv(h_mm)
        run_window(lib, lp.attn, layer, t, _tables(lp.attn, x.device), qkv, bf, lp.qkv.scale, h, y)
        o = lp.o(y)
        lib.laplace_add_norm(xp, o.data_ptr(), bf, lp.o.scale_ptr(), d, lp.ffn_norm.weight.data_ptr(), lp.ffn_norm.eps,
                             None, hmp, bf)
        gu = lp.gate_up(h_mm)
        lib.laplace_silu_mul(gu.data_ptr(), bf, lp.gate_up.scale_ptr(), f, ap, bf)
        prev, prev_scale = lp.down(a), lp.down.scale_ptr()
    lib.laplace_add_norm(xp, prev.data_ptr(), bf, prev_scale, d, model.norm.weight.data_ptr(), model.norm.eps, hp, hmp, bf)
    logits = plan.head(h_mm)
    if plan.int8:
        logits = torch.mul(logits, plan.head.scale)
    state.advance_(1)
    return logits


def _tables(attn: Any, device: torch.device) -> Any:
    """The step's tables for the window mixer `attn`, its memory read at its layer's distance."""
    c = attn.config
    return step_tables(c.sinks, c.window, c.head_k_dim, c.rope_theta, device, attn.memory_at)


def forward(plan: Plan, model: nn.Module, input_ids: Tensor, state: Any, *, last_only: bool, head: bool) -> tuple[Tensor, Any]:
    """`LaplaceModel.forward` for one row without padding: the matmuls over all T rows at once
    (torch), the window mixer token after token in one C call per layer (the step's numbers,
    so a prefill and the decode that follows it agree). The input state is not modified: the
    new state is a copy advanced in place."""
    lib = native.library()
    c = model.config
    T = input_ids.shape[1]
    state = state.clone()
    t0 = int(state.positions)
    x = model.embed(input_ids[0]).float()
    y = torch.empty(T, c.n_heads * c.head_v_dim)
    for lp, layer in zip(plan.layers, state.layer_views(c)):
        h = lp.attn_norm(x).contiguous()
        qkv = lp.qkv.rows(h).contiguous()
        run_window(lib, lp.attn, layer, t0, _tables(lp.attn, input_ids.device), qkv, 0, None, h, y)
        x = x + lp.o.rows(y)
        gate, up = lp.gate_up.rows(lp.ffn_norm(x)).split(c.ffn_dim, -1)
        x = x + lp.down.rows(F.silu(gate) * up)
    if last_only:
        x = x[-1:]
    out = model.head(x) if head else x
    state.advance_(T)
    return out[None], state
