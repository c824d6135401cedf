"""A whole batch-1 decode step of a window-mixer model in few calls: torch runs the matmuls,
`decode.c` everything between them (issue 35).

Per layer a step is seven calls: add+norm (C), q/k/v (one matmul), the window mixer (C),
o_proj, add+norm (C), gate/up (one matmul), silu*up (C), down; then the final norm (C) and
the LM head. `LaplaceModel.step_` (the torch step, which stays the reference) used ~120
torch ops per layer, and their dispatch cost more than the arithmetic.

With int8 weights the matmuls are `torch._weight_int8pack_mm` on bf16 activations, their
outputs bf16 and scaled per channel afterwards, as `quant.Int8Linear` does for a decode
row; the C kernels read and write that form directly, so no activation is converted by a
torch op. With fp32 weights everything is fp32.

`plan_for(model)` says whether a model can take this path, and builds the plan once; it
is checked (the same modules, no hooks) on every step, so a LoRA wrapper, a replaced
weight or a probe's hook sends the step back to the torch path. Models it does not cover
(memory slots, other mixers, a half-precision model, a GPU) take the torch path too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime import native
from agent.runtime.layers import GLU, RMSNorm
from agent.runtime.quant import Int8Embedding, Int8Linear, _ones_bf16
from agent.runtime.window_decode import step_tables, window_args


@dataclass
class Matmul:
    """One (possibly fused) bias-free projection: int8 rows + scales, or an fp32 matrix."""

    weight: Tensor
    scale: Tensor | None  # int8 only
    ones: Tensor | None = None  # int8: the kernel's unit scales (the real ones are applied by the next C call)

    def __call__(self, x: Tensor) -> Tensor:
        if self.scale is not None:
            return torch._weight_int8pack_mm(x, self.weight, self.ones)
        return F.linear(x, self.weight)

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
    key: tuple[int, ...]  # ids of every module and tensor the plan read: the model unchanged since
    modules: list[nn.Module]


def _matmul(owner: nn.Module, names: tuple[str, ...], int8: bool) -> Matmul | None:
    """The projection `names` of `owner` as one matrix: a fused group (`layers.project`'s
    entry, still valid) or a single Linear of the expected kind; None otherwise."""
    if len(names) > 1:
        entry = owner.__dict__.get("_fused", {}).get(names)
        if entry is None:
            return None
        fused, mods, ptrs, _ = entry
        if not all(getattr(owner, n) is m and m.weight.data_ptr() == p for n, m, p in zip(names, mods, ptrs)):
            return None
        mod = fused
    else:
        mod = getattr(owner, names[0])
    return _linear(mod, int8)


def _linear(mod: Any, int8: bool) -> Matmul | None:
    if int8 and type(mod) is Int8Linear and mod.bias is None:
        w = mod.weight
        # _weight_int8pack_mm's vector loops (the Int8Linear decode row's path) need K % 16 == 0 and aligned rows.
        if w.is_contiguous() and w.shape[1] % 16 == 0 and w.data_ptr() % 16 == 0:
            return Matmul(w, mod.scale.contiguous(), _ones_bf16(w.shape[0]))
        return None
    if not int8 and isinstance(mod, Tensor):  # a fused fp32 group is its matrix
        return Matmul(mod, None) if mod.dtype == torch.float32 else None
    if not int8 and type(mod) is nn.Linear and mod.bias is None and mod.weight.dtype == torch.float32:
        return Matmul(mod.weight, None)
    return None


def _key(modules: list[nn.Module]) -> tuple[int, ...]:
    """Identities of the modules' children, parameters and buffers: any replacement changes it."""
    ids: list[int] = []
    for m in modules:
        ids.append(id(m))
        ids.extend(map(id, m._modules.values()))
        ids.extend(map(id, m._parameters.values()))
        ids.extend(map(id, m._buffers.values()))
    return tuple(ids)


def build_plan(model: nn.Module) -> Plan | None:
    c = model.config
    if c.mixer != "window" or c.memory_slots or not c.ffn_dim or c.head_k_dim != c.head_v_dim:
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
    modules = [model, *model.modules()]
    return Plan(int8, layers, head, _key(modules), modules)


def plan_for(model: nn.Module, state: Any) -> Plan | None:
    """The model's plan if its step can run here now on `state` (built once, then checked), else None."""
    if state.batch_size != 1 or any(t.dtype != torch.float32 or not t.is_contiguous() for t in state.layer_tensors.values()):
        return None
    if torch.is_grad_enabled() or torch.nn.modules.module._global_forward_hooks or \
            torch.nn.modules.module._global_forward_pre_hooks:
        return None
    lib = native.library()
    if lib is None:
        return None
    cached = model.__dict__.get("_native_plan")
    if cached is not None and cached is not False:
        if _key(cached.modules) == cached.key and not any(m._forward_hooks or m._forward_pre_hooks for m in cached.modules):
            return cached
        cached = None
    if cached is None:
        cached = build_plan(model) or False
        model.__dict__["_native_plan"] = cached
    if cached is False or any(m._forward_hooks or m._forward_pre_hooks for m in cached.modules):
        return None
    return cached


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
    tabs = step_tables(c.sinks, c.window, c.head_k_dim, c.rope_theta, x.device)
    xp, hp, hmp, yp, ap = x.data_ptr(), h.data_ptr(), h_mm.data_ptr(), y.data_ptr(), a.data_ptr()
    prev: Tensor | None = None
    prev_scale = None
    for lp, layer in zip(plan.layers, state.layer_views()):
        lib.laplace_add_norm(xp, None if prev is None else prev.data_ptr(), bf, prev_scale, d,
                             lp.attn_norm.weight.data_ptr(), lp.attn_norm.eps, hp, hmp, bf)
        qkv = lp.qkv(h_mm)
        args, keep = window_args(lp.attn, layer, t, tabs, qkv.data_ptr(), bf, lp.qkv.scale_ptr(), h)
        if lib.laplace_window_step(*args, yp) != 0:
            raise ValueError("the window step kernel refused the model's shapes")
        o = lp.o(y)
        lib.laplace_add_norm(xp, o.data_ptr(), bf, lp.o.scale_ptr(), d, lp.ffn_norm.weight.data_ptr(), lp.ffn_norm.eps,
                             None, hmp, bf)
        gu = lp.gate_up(h_mm)
        lib.laplace_silu_mul(gu.data_ptr(), bf, lp.gate_up.scale_ptr(), f, ap, bf)
        prev, prev_scale = lp.down(a), lp.down.scale_ptr()
        del keep
    lib.laplace_add_norm(xp, prev.data_ptr(), bf, prev_scale, d, model.norm.weight.data_ptr(), model.norm.eps, hp, hmp, bf)
    logits = plan.head(h_mm)
    if plan.int8:
        logits = torch.mul(logits, plan.head.scale)
    state.advance_(1)
    return logits
