"""Turning logits into a token: greedy, temperature, top-k, top-p, repetition penalty.

Sampling always takes an explicit, seeded generator; temperature 0 is greedy. Two backends
draw by one rule: `sample` (torch logits, a `torch.Generator`: the torch runners and the
server's batches) and `sample_array` (numpy logits, a `numpy.random.Generator`: the
torch-free engine, `agent.runtime.native`). A seed reproduces a reply within one backend;
the two draw from different random streams. This module imports torch only inside the
torch functions, so the engine's process never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """What a generation reads: how to draw each token (`sample`) and when to stop.

    Validated here; text such as `-o temperature 0.2` is parsed by the one owner of a
    session's options, the chat service (agent/chat/options.py)."""

    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    import torch

    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def apply_repetition_penalty(logits: Tensor, history: Tensor | None, penalty: float) -> Tensor:
    """CTRL-style: divide positive logits of seen tokens by `penalty`, multiply negative ones."""
    if history is None or penalty == 1.0 or history.numel() == 0:
        return logits
    import torch

    seen = logits.gather(-1, history)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(-1, history, seen)


def sample(logits: Tensor, generator: torch.Generator, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           repetition_penalty: float = 1.0, history: Tensor | None = None) -> Tensor:
    """logits [B, vocab] -> token ids [B]. `history` [B, N] are tokens to penalize."""
    import torch

    logits = apply_repetition_penalty(logits.float(), history, repetition_penalty)
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(-1).to(logits.device)


def make_rng(seed: int | None) -> np.random.Generator:
    """`sample_array`'s generator: seeded, or from the OS's entropy when `seed` is None."""
    return np.random.default_rng(seed)


def sample_array(logits: np.ndarray, rng: np.random.Generator, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, history: Sequence[int] = ()) -> int:
    """`sample`'s rule for one row of numpy logits [vocab] (or [1, vocab]) -> a token id:
    the same penalty, greedy argmax (the first index on ties), top-k and top-p cuts, then one
    uniform draw against the cumulative probabilities."""
    x = np.asarray(logits, dtype=np.float32).reshape(-1)
    if history and repetition_penalty != 1.0:
        x = x.copy()
        seen = np.asarray(history, dtype=np.int64)
        v = x[seen]
        x[seen] = np.where(v > 0, v / np.float32(repetition_penalty), v * np.float32(repetition_penalty))
    if temperature == 0:
        return int(np.argmax(x))
    x = x.astype(np.float64) / temperature
    if top_k and top_k < x.size:
        kth = np.partition(x, x.size - top_k)[x.size - top_k]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        p = np.exp(x[order] - x[order[0]])
        p /= p.sum()
        drop = np.cumsum(p) - p >= top_p  # the mass before it already reaches top_p (the first is always kept)
        x[order[drop]] = -np.inf
    p = np.exp(x - x.max())
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), x.size - 1))
