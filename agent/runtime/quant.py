"""int8 weight-only inference on CPU: every matmul's weight is int8, the tied LM head's too.

- Every nn.Linear becomes an `Int8Linear`: int8 weights with one fp32 scale per output
  channel (symmetric). A decode step's row runs `torch._weight_int8pack_mm` (the int8 rows
  widened in registers, so it streams 1 byte per weight; its input rounded to bf16, as the
  kernel's vector loops want); a prefill's many rows widen the weight a block at a time for
  a GEMM: to bf16 (exact for int8) with bf16 activations where the CPU has bf16 dot
  products (`_bf16_gemm`: the decode row's arithmetic, at ~4x fp32's rate here), else to fp32.
  The activations are never int8.
- A tied LM head (Mamba-2 checkpoints read the input embedding as the head, which is no
  nn.Linear) becomes such a Linear too, built from the embedding's weight: it is the
  largest single matmul of a small model (50k x 768 at Mamba-2-130M's shape).
- The embedding table becomes int8 rows with one fp32 scale each (`Int8Embedding`): a
  step reads one row of it, but an fp32 table would still hold 4 bytes per weight in memory.

Why the activations stay fp32 (issue 35): the first scheme quantized each Linear's input
per token with one scale (fbgemm dynamic int8). The default model (SmolLM2-135M) has
per-channel activation outliers (a down_proj input's largest channel ~10x its median), so
one scale per token rounds the ordinary channels away: held-out perplexity rose 89%
(29.99 -> 56.64). SmoothQuant (alpha 0.5, calibrated on README prose) recovered only
part of it (+37%). These int8 weights cost +0.38% (top-1 agreement 95.2%, the text read
as prefill segments) and +0.36% (95.4%) read through the decode form, on the bench's
held-out text; `laplace bench dtype` measures it.

Norms, conv, decay gates and the GLA state stay fp32. A 1B-parameter model's fp32 decode
reads ~5.6 GB of weights per token; int8 reads a quarter of that, and `laplace bench
cpu1b` measures what that buys on the machine at hand. Quantization changes the numbers,
so a quantized model has its own fingerprint: a state made with it is never paired with
the fp32 model, and the reverse.

`checkpoint.load_model_dir(..., quant="int8")` builds these modules straight from the file,
tensor by tensor, so a quantized model never exists in fp32 first.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from agent.runtime.device import has_fast_bf16
# Torch-free, so a start that needs no torch can name the modes and derive the fingerprint.
# QUANT_SCHEME names what `quantize_rows` computes: change it with that arithmetic.
from agent.runtime.modeldir import QUANT_MODES, QUANT_SCHEME, quantized_fingerprint

_ROWS = 4096  # rows quantized at a time: the fp32 temporaries stay small for any table
# From this many input rows on (a prefill, a scored segment) an Int8Linear widens its weight
# to fp32 a block of rows at a time and runs BLAS's blocked GEMM: the widening reads the
# weight once, which below ~16 rows costs more than it saves; _weight_int8pack_mm's CPU
# kernel is a small register-tiled loop (4x4 tiles) made for few rows, far from a blocked
# GEMM's rate over hundreds of rows.
GEMM_ROWS = 16
_GEMM_BLOCK = 1 << 22  # weights widened at a time by that GEMM path (16 MB of fp32)


# The many-row path widens the int8 rows to bf16 (exact: |q| <= 127) and runs a bf16 GEMM
# with fp32 sums, its activations rounded to bf16 as the decode row's kernel rounds them, where
# bf16 matmuls are measured fast on this CPU (`device.has_fast_bf16`: here 568 GFLOP/s against
# fp32's 138 on 2 threads); where they are emulated (~50x slower on some CPUs) it widens to
# fp32. None: measure (once per process); True / False: pinned (tests).
BF16_GEMM: bool | None = None


def _bf16_gemm() -> bool:
    return BF16_GEMM if BF16_GEMM is not None else has_fast_bf16(torch.device("cpu"))


def check_int8_kernels() -> None:
    if not hasattr(torch, "_weight_int8pack_mm"):
        raise ValueError(f"torch {torch.__version__} has no int8 weight matmul (_weight_int8pack_mm); "
                         "run without LAPLACE_DTYPE=int8 or upgrade torch")


def quantize_rows(w: Tensor, q: Tensor | None = None, scale: Tensor | None = None, *,
                  work: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: w [N, K] (any float dtype) -> (q int8 [N, K], scale fp32 [N]),
    w ~= q * scale[:, None]. Done in blocks of rows, so no fp32 copy of a big table is made.
    `q`, `scale`: where to write them (a load's rows of a larger matrix), else new tensors.
    `work`: fp32 scratch for a block's temporaries (a load reuses one for every tensor: a
    fresh one per block left freed holes in the heap), used when it holds a block."""
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device) if q is None else q
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device) if scale is None else scale
    for start in range(0, w.shape[0], _ROWS):
        block = w[start : start + _ROWS].float()
        t = work[: block.numel()].view(block.shape) if work is not None and work.numel() >= block.numel() else torch.empty_like(block)
        s = torch.abs(block, out=t).amax(dim=1).clamp(min=1e-12) / 127.0
        q[start : start + _ROWS].copy_(torch.div(block, s[:, None], out=t).round_().clamp_(-127, 127))  # exact integers: the cast is exact
        scale[start : start + _ROWS] = s
    return q, scale


@functools.lru_cache(maxsize=64)
def _ones_bf16(n: int) -> Tensor:
    """The int8 kernel's scales argument when the real scales are applied after it."""
    return torch.ones(n, dtype=torch.bfloat16)


class Int8Linear(nn.Module):
    """y = x @ (q * scale[:, None]).T + bias with q int8 [out, in] and x fp32: the weight is
    int8, the activations are not (see the module docstring for why)."""

    def __init__(self, q: Tensor, scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] < GEMM_ROWS and self.in_features % 16 == 0 and self.weight.data_ptr() % 16 == 0:
            # bf16 activations: the kernel's x86 AVX2/AVX-512 loops are written for bf16 only
            # (its fp32 form is scalar code: no packed FMA in torch 2.13's libtorch_cpu). It
            # sums in fp32 and rounds the sums to bf16; the scales are applied after, in fp32
            # (bf16 scales doubled the perplexity cost on the default model: +0.79% vs +0.36%).
            # Those loops step K by 16 with aligned loads: a K not a multiple of 16 reads past
            # each row (garbage, or a crash from 2 rows on), and its weight loads are 16-byte
            # aligned ones, so such a Linear (or a view of a weight at an odd offset) takes the scalar form.
            xb = x2.to(torch.bfloat16, copy=True, memory_format=torch.contiguous_format)  # fresh: 64-byte aligned
            y = torch._weight_int8pack_mm(xb, self.weight, _ones_bf16(self.out_features))
            y = torch.mul(y, self.scale)  # bf16 x fp32: promoted, one op to an fp32 result
        elif x2.shape[0] < GEMM_ROWS:
            y = torch._weight_int8pack_mm(x2.float().contiguous(), self.weight, self.scale)
        elif _bf16_gemm():
            xb = x2.to(torch.bfloat16)
            y = x2.new_empty(x2.shape[0], self.out_features, dtype=torch.float32)
            step = max(1, _GEMM_BLOCK // self.in_features)  # rows widened at a time
            for r in range(0, self.out_features, step):
                # bf16 sums rounded to bf16, then scaled in fp32: the decode row's arithmetic.
                torch.mul(xb @ self.weight[r : r + step].to(torch.bfloat16).t(), self.scale[r : r + step], out=y[:, r : r + step])
        else:
            x2 = x2.float()
            y = x2.new_empty(x2.shape[0], self.out_features)
            step = max(1, _GEMM_BLOCK // self.in_features)  # rows widened at a time: a 16 MB fp32 block
            for r in range(0, self.out_features, step):
                w = self.weight[r : r + step].float().mul_(self.scale[r : r + step, None])
                y[:, r : r + step] = x2 @ w.t()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def int8_linear(q: Tensor, scale: Tensor, bias: Tensor | None) -> Int8Linear:
    """An int8-weight Linear from per-row int8 weights (out x in) and their scales."""
    return Int8Linear(q, scale, bias)


def linear_to_int8(lin: nn.Linear) -> Int8Linear:
    q, scale = quantize_rows(lin.weight.detach())
    return int8_linear(q, scale, lin.bias)


class Int8Embedding(nn.Module):
    """An embedding table held as int8 rows and one fp32 scale per row; the rows looked up
    are dequantized to fp32. `weight` is the int8 table (its `.device` is the model's)."""

    def __init__(self, q: Tensor, scale: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)

    @classmethod
    def from_float(cls, weight: Tensor) -> "Int8Embedding":
        return cls(*quantize_rows(weight.detach()))

    def forward(self, ids: Tensor) -> Tensor:
        return self.weight[ids].float() * self.scale[ids].unsqueeze(-1)


def quantize_int8_(model: nn.Module) -> nn.Module:
    """Make every matmul of `model` int8 in place (see the module docstring): each
    nn.Linear, a tied LM head (`lm_head` None beside an `embed`), and the embedding."""
    check_int8_kernels()
    embed = getattr(model, "embed", None)
    if isinstance(embed, nn.Embedding) and hasattr(model, "lm_head") and model.lm_head is None:
        q, scale = quantize_rows(embed.weight.detach())
        model.lm_head = int8_linear(q, scale, None)
        model.embed = Int8Embedding(q, scale)  # the same int8 rows: one table, two uses
    elif isinstance(embed, nn.Embedding):
        model.embed = Int8Embedding.from_float(embed.weight)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, linear_to_int8(child))
    for module in model.modules():
        fused = module.__dict__.get("_fused", {})
        for names in list(fused):
            # A decode-layout model's fused fp32 matrix: replaced by the int8 one (so a step
            # still runs q/k/v and gate/up as one matmul each), and freed.
            del fused[names]
            mods = [getattr(module, n) for n in names]
            if all(type(m) is Int8Linear and m.bias is None for m in mods):
                fuse_int8_(module, names, mods)
    return model


def fuse_int8_(owner: nn.Module, names: tuple[str, ...], mods: list[Int8Linear]) -> bool:
    """`layers.fuse_linears_` for bias-free Int8Linears: one int8 matrix and one scale vector,
    each Linear's buffers views of its rows (False if their input widths differ)."""
    if len({m.in_features for m in mods}) != 1:
        return False
    adopt_fused_int8_(owner, names, Int8Linear(torch.cat([m.weight for m in mods]), torch.cat([m.scale for m in mods]), None))
    return True


def adopt_fused_int8_(owner: nn.Module, names: tuple[str, ...], fused: Int8Linear) -> None:
    """Make `owner`'s bias-free Int8Linears `names` views of consecutive rows of `fused`'s
    weight and scale (a copy `fuse_int8_` made, or the matrix a load quantized them into)
    and record the group for `layers.project`."""
    mods = [getattr(owner, n) for n in names]
    rows, start = [], 0
    for m in mods:
        n = m.out_features
        m.weight, m.scale = fused.weight[start : start + n], fused.scale[start : start + n]  # buffers: views now
        rows.append(n)
        start += n
    if start != fused.out_features:
        raise ValueError(f"{names} hold {start} rows, the fused matrix {fused.out_features}")
    ptrs = [m.weight.data_ptr() for m in mods]
    owner.__dict__.setdefault("_fused", {})[names] = (fused, mods, ptrs, rows)


def quantize_loaded(lm: Any, mode: str) -> Any:
    """Quantize a loaded fp32 CPU model (a `checkpoint.LoadedModel`, not imported here:
    checkpoint imports this module) in place; its fingerprint says how."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    if lm.model.embed.weight.device.type != "cpu" or lm.model.embed.weight.dtype != torch.float32:
        raise ValueError("int8 weights are for fp32 models on the CPU; use --device cpu and no other dtype")
    base = lm.fingerprint  # over the fp32 weights, before they change form
    quantize_int8_(lm.model)
    lm._fingerprint = quantized_fingerprint(base, mode)
    lm.card = {**lm.card, "weights": mode}
    return lm
