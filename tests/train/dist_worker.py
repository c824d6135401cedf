"""Worker bodies for the multi-process tests (spawned; one process per gloo rank).

Each writes its results as JSON (or tensors with torch.save) under the given folder;
the test process compares them with single-process runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

NS_SHAPES = [(5, 3), (7, 4), (3, 8), (64, 32), (1, 6)]  # uneven, empty and tall/wide shards


def ns_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return [torch.randn(*s, generator=g) for s in NS_SHAPES]


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))


def newton_schulz_worker(rank: int, world: int, port: int, out: str) -> None:
    from agent.train.dist_muon import orthogonalize_sharded, shard_rows
    from agent.train.muon import newton_schulz

    _env(rank, world, port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shards = []
    for m in ns_inputs():
        sizes = shard_rows(m.shape[0], world)
        shards.append(m[sum(sizes[:rank]) : sum(sizes[: rank + 1])].clone())
    result, sent = orthogonalize_sharded(shards, NS_SHAPES, group=dist.group.WORLD, ns=newton_schulz)
    torch.save({"shards": result, "sent": sent}, Path(out) / f"ns_{rank}.pt")
    dist.destroy_process_group()


def train_worker(rank: int, world: int, port: int, runs: list[dict[str, Any]], out: str) -> None:
    """Run the given TrainConfig dicts one after another as one torchrun-like job."""
    from agent.train.config import TrainConfig
    from agent.train.loop import Trainer

    _env(rank, world, port)
    torch.manual_seed(0)
    results = []
    for run in runs:
        t = Trainer(TrainConfig(**{**run, "data": tuple(run["data"]), "distributed": True}))
        summary = t.run()
        results.append({"losses": [m["loss"] for m in t.history], "summary": summary, "comm": t.comm_log})
    (Path(out) / f"train_{rank}.json").write_text(json.dumps(results), encoding="utf-8")
    if dist.is_initialized():
        dist.destroy_process_group()
