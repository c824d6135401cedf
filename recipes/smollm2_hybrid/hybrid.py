"""The window hybrid built straight from the teacher's GGUF, for the recipe's training and
measurements (what `laplace import` would write, without a model directory in between)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agent.importers.llama import HybridOptions, hybrid_weights
from agent.runtime.checkpoint import model_from_tensors


def build(g: Any, opts: HybridOptions) -> torch.nn.Module:
    """The hybrid of `opts` on the weights of `g` (`agent.importers.gguf_source.read_gguf`'s
    result); the tensors are cloned, so models built from one read never share storage."""
    config, tensors = hybrid_weights(g.shape, g.tensors, opts, name="measure")
    return model_from_tensors(config, {k: v.clone() for k, v in tensors.items()}, where="measure").eval()


def teacher(gguf: Path) -> torch.nn.Module:
    """The teacher itself, for the baselines: transformers' own Llama on the same GGUF, fp32,
    full attention with its KV cache (a test extra: transformers reads a GGUF only with
    accelerate installed)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
