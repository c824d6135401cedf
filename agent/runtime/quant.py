"""int8 weight-only inference on CPU: every matmul's weight is int8, the tied LM head's too.

- Every nn.Linear becomes a dynamically quantized int8 Linear (weights per output channel,
  symmetric; activations quantized per call; int8 GEMM in fbgemm/x86).
- A tied LM head (Mamba-2 checkpoints read the input embedding as the head, which is no
  nn.Linear) becomes such a Linear too, built from the embedding's weight: it is the
  largest single matmul of a small model (50k x 768 at Mamba-2-130M's shape).
- The embedding table becomes int8 rows with one fp32 scale each (`Int8Embedding`): a
  step reads one row of it, but an fp32 table would still hold 4 bytes per weight in memory.

Norms, conv, decay gates and the GLA state stay fp32. A 1B-parameter model's fp32 decode
reads ~5.6 GB of weights per token; int8 reads a quarter of that, and `laplace bench
cpu1b` measures what that buys on the machine at hand. Quantization changes the numbers,
so a quantized model has its own fingerprint: a state made with it is never paired with
the fp32 model, and the reverse.

`checkpoint.load_model_dir(..., quant="int8")` builds these modules straight from the file,
tensor by tensor, so a quantized model never exists in fp32 first.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized import dynamic as nnqd

QUANT_MODES = ("int8",)
_ROWS = 4096  # rows quantized at a time: the fp32 temporaries stay small for any table


def check_int8_kernels() -> None:
    if not {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines):
        raise ValueError("this torch build has no x86/fbgemm int8 kernels; run without LAPLACE_DTYPE=int8")


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: w [N, K] (any float dtype) -> (q int8 [N, K], scale fp32 [N]),
    w ~= q * scale[:, None]. Done in blocks of rows, so no fp32 copy of a big table is made."""
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for start in range(0, w.shape[0], _ROWS):
        block = w[start : start + _ROWS].float()
        s = block.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q[start : start + _ROWS] = (block / s[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        scale[start : start + _ROWS] = s
    return q, scale


def int8_linear(q: Tensor, scale: Tensor, bias: Tensor | None) -> nnqd.Linear:
    """A dynamic int8 Linear from per-row int8 weights (out x in) and their scales."""
    out_f, in_f = q.shape
    # Built 1 x 1 and then given the real weight: the constructor's placeholder weight of
    # the full shape would briefly cost out x in bytes more (262 MB for a 128k x 2048 head).
    with warnings.catch_warnings():  # torch.ao announces quantized tensors' move to torchao
        warnings.simplefilter("ignore")
        m = nnqd.Linear(1, 1, bias_=bias is not None, dtype=torch.qint8)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(out_f, dtype=torch.long), 0)
        m.set_weight_bias(qw, None if bias is None else bias.detach().float())
    m.in_features, m.out_features = in_f, out_f
    return m


def linear_to_int8(lin: nn.Linear) -> nnqd.Linear:
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
    return model


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


def quantized_fingerprint(base: str, mode: str) -> str:
    """The fingerprint of a model quantized from one whose fingerprint is `base`."""
    return hashlib.sha256(f"{base}+{mode}".encode()).hexdigest()
