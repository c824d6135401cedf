"""The window hybrid built straight from the teacher's GGUF, for the recipe's training and
measurements (what `laplace import` would write, without a model directory in between)."""

from __future__ import annotations

from typing import Any

import torch

from agent.importers.llama import HybridOptions, hybrid_weights
from agent.runtime.checkpoint import model_from_tensors


def build(g: Any, opts: HybridOptions) -> torch.nn.Module:
    """The hybrid of `opts` on the weights of `g` (`agent.importers.gguf_source.read_gguf`'s
    result); the tensors are cloned, so models built from one read never share storage."""
    config, tensors = hybrid_weights(g.shape, g.tensors, opts, name="measure")
    return model_from_tensors(config, {k: v.clone() for k, v in tensors.items()}, where="measure").eval()
