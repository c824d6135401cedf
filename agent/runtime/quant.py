"""int8 weight-only inference on CPU: every Linear (block matrices and the LM head) becomes
a dynamically quantized int8 Linear (per-output-channel weights, activations quantized per
call, int8 GEMM in fbgemm/x86). The embedding, norms, conv, decay gates and the GLA state
stay fp32.

A 1B-parameter model's fp32 decode reads ~5.6 GB of weights per token; int8 reads a
quarter of that, and `laplace bench cpu1b` measures what that buys on the machine at hand
(small models that fit in cache run faster in fp32). Quantization changes the numbers, so
a quantized model has its own fingerprint: a state made with it is never paired with the
fp32 model, and the reverse.
"""

from __future__ import annotations

import hashlib
import warnings

import torch
from torch import nn

from agent.runtime.checkpoint import LoadedModel

QUANT_MODES = ("int8",)


def quantize_int8_(model: nn.Module) -> nn.Module:
    """Replace the model's nn.Linear modules by dynamically quantized int8 ones, in place."""
    engines = torch.backends.quantized.supported_engines
    if not {"x86", "fbgemm"} & set(engines):
        raise ValueError("this torch build has no x86/fbgemm int8 kernels; run without LAPLACE_DTYPE=int8")
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


def quantize_loaded(lm: LoadedModel, mode: str) -> LoadedModel:
    """Quantize a loaded fp32 CPU model in place; its fingerprint says how."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    if lm.model.embed.weight.device.type != "cpu" or lm.model.embed.weight.dtype != torch.float32:
        raise ValueError("int8 weights are for fp32 models on the CPU; use --device cpu and no other dtype")
    base = lm.fingerprint  # over the fp32 weights, before they change form
    quantize_int8_(lm.model)
    lm._fingerprint = hashlib.sha256(f"{base}+{mode}".encode()).hexdigest()
    lm.card = {**lm.card, "weights": mode}
    return lm
