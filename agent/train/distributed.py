"""Process groups and FSDP2 for `torchrun -m agent.train` (gloo on CPU, nccl on CUDA).

The model is sharded with `fully_shard` block by block and then at the root; every
parameter becomes a DTensor sharded on dim 0, which is what `dist_muon` expects.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    group: Any = None
    mesh: Any = None

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> DistInfo:
    """Join the torchrun job described by the environment (or run alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not dist.is_initialized():
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(device.type, (world,))
    return DistInfo(rank=rank, world=world, group=mesh.get_group(), mesh=mesh)


def shard_model(model: nn.Module, info: DistInfo) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    # Blocks return the conv cache as a view; nothing writes to it in place, so FSDP2's
    # warning about in-place ops on views does not apply here.
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    for block in model.blocks:  # type: ignore[attr-defined]
        fully_shard(block, mesh=info.mesh)
    fully_shard(model, mesh=info.mesh)
    return model


def full_tensor(t: Tensor) -> Tensor:
    """A whole tensor from a DTensor (a collective: every rank must call it), else `t`."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def like_param(full: Tensor, param: Tensor) -> Tensor:
    """`full` laid out like `param` (this rank's shard when param is a DTensor)."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        # Every rank read the same file, so each keeps its own slice with no communication.
        return distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    return full.to(param.device)


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=info.group)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier(group=info.group)
