"""Perplexity, one way for every measurement of the recipe: per-token losses first, so that
a report can cut them by position (within the window, past it) as well as take the whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F


@torch.inference_mode()
def token_losses(model: torch.nn.Module, ids: Sequence[int] | torch.Tensor, segment: int | None = None) -> list[float]:
    """-log p(ids[t + 1] | ids[:t + 1]) for every t, through the runtime: in one pass, or
    `segment` tokens a call with the state carried, as a chat session reads."""
    x = torch.as_tensor(ids)
    n = len(x) - 1
    step = segment or n
    state = None
    out: list[float] = []
    for s in range(0, n, step):
        seg = x[s:min(s + step, n)]
        logits, state = model(seg[None], state)
        out += F.cross_entropy(logits[0].float(), x[s + 1:s + 1 + len(seg)], reduction="none").tolist()
    return out


@torch.inference_mode()
def teacher_losses(model: torch.nn.Module, ids: Sequence[int]) -> list[float]:
    """The same losses from transformers' own Llama (full causal attention, one pass)."""
    x = torch.as_tensor(ids)
    logits = model(x[None, :-1]).logits
    return F.cross_entropy(logits[0].float(), x[1:], reduction="none").tolist()


def perplexity(losses: Sequence[Sequence[float]], lo: int = 0, hi: int | None = None) -> float:
    """Perplexity over the predictions at query positions lo <= t < hi of every document
    (`losses`: one list of `token_losses` per document)."""
    xs = [v for doc in losses for v in doc[lo:hi]]
    return math.exp(sum(xs) / len(xs))


def whole_and_tail(model: torch.nn.Module, ids: Sequence[int] | torch.Tensor, tail: int) -> tuple[float, float]:
    """(perplexity over every prediction of one pass, over its last `tail` predictions)."""
    losses = token_losses(model, ids)
    return perplexity([losses]), perplexity([losses], len(losses) - tail)
