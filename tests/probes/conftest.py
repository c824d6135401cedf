"""Shared fixtures: the untrained tiny preset on CPU, one torch thread (restored after)."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from agent.runtime.checkpoint import LoadedModel, load_model


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    # Session scope: module-scoped fixtures (which run before function-scoped ones) see it too.
    # Tiny models run fastest on one thread, and a shared 2-core box stays responsive.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny")


@pytest.fixture()
def random_tiny() -> LoadedModel:
    """Tiny with random, data-dependent decay gates (the schedule is no longer exact)."""
    lm = load_model("tiny", seed=7)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for block in lm.model.blocks:
            w = block.attn.decay_weight
            w.copy_(torch.randn(w.shape, generator=gen) * 0.5)
    lm._fingerprint = None
    return lm
