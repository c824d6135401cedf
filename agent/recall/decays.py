"""Reading the decays a model applies: how long each head keeps what it writes.

With a scalar decay per head, the share of a write still present after a stretch of tokens
is exp(sum of the log-decays g over it). The decays are data-dependent, so they are captured
while the model reads (a forward hook on each mixer's `decay_tap`, the identity that g
passes through, whichever mixer the model has). The recall horizon reads half-lives from
here, and so do the probes' retention ledger and the session check.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor

from agent.runtime.model import LaplaceModel


class DecayRecorder:
    """Collects g [B, T, H] per layer from every forward pass while installed."""

    def __init__(self, n_layers: int) -> None:
        self.parts: list[list[Tensor]] = [[] for _ in range(n_layers)]

    def take(self) -> Tensor:
        """Everything recorded so far as [L, B, T, H] (then cleared)."""
        out = torch.stack([torch.cat(p, dim=1) for p in self.parts])
        self.parts = [[] for _ in self.parts]
        return out


@contextmanager
def capture_decays(model: LaplaceModel) -> Iterator[DecayRecorder]:
    rec = DecayRecorder(len(model.blocks))
    handles = []
    for i, block in enumerate(model.blocks):

        def hook(_mod: torch.nn.Module, _inp: object, out: Tensor, i: int = i) -> None:
            rec.parts[i].append(out.detach().float().cpu())

        handles.append(block.attn.decay_tap.register_forward_hook(hook))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def half_lives(g: Tensor) -> tuple[Tensor, Tensor]:
    """(mean log-decay, effective half-life) per layer and head, both [L, H] in float64,
    from g [L, T, H]; a head that does not decay has an infinite half-life."""
    mean = g.double().mean(dim=1)
    return mean, torch.where(mean < 0, math.log(2.0) / -mean, torch.full_like(mean, math.inf))


def resting_half_lives(model: LaplaceModel) -> list[list[float]]:
    """Half-life per layer and head at the gate's resting value (input term left out).

    A cheap estimate that needs no tokens: the session check uses it so its cost does not
    grow with the history. The ledger's measured half-lives are the reference."""
    out = []
    for block in model.blocks:
        g = block.attn.resting_log_decay().detach().cpu()
        out.append([round6(math.log(2.0) / -x) if x < 0 else math.inf for x in g.tolist()])
    return out


def round6(x: float) -> float:
    """Six significant digits: stable JSON across runs, enough for every report."""
    if not math.isfinite(x):
        return x
    return float(f"{x:.6g}")
