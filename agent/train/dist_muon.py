"""Distributed Muon for FSDP2 ("MuonFSDP2"): whole matrices orthogonalized in parallel.

FSDP2 shards every matrix on dim 0 (`torch.chunk` sizes: ceil(rows / W) per rank, the
last ranks may hold fewer rows or none). Newton-Schulz needs the whole matrix, so:

1. every matrix gets one owner rank (greedy by size, the same on every rank);
2. all_to_all #1 sends each rank's shard of matrix i to owner(i), which stacks the rows;
3. the owner runs Newton-Schulz on its whole matrices (W matrices in parallel);
4. all_to_all #2 sends each rank its rows of the result back.

Per rank this sends about 2 M (W - 1) / W^2 values for M Muon parameters, against
M (W - 1) / W when every rank all-gathers every matrix and orthogonalizes all of them
itself: a saving of about W / 2 (and 1 / W of the Newton-Schulz work per rank).
`traffic_bytes` is the accounting used both for the analytic numbers and, in tests, to
check the bytes the collectives really sent.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def shard_rows(rows: int, world: int) -> list[int]:
    """Rows each rank holds under FSDP2's dim-0 sharding (torch.chunk semantics)."""
    per = -(-rows // world)
    return [max(0, min(per, rows - r * per)) for r in range(world)]


def assign_owners(shapes: Sequence[Sequence[int]], world: int) -> list[int]:
    """Owner rank of each matrix: largest first onto the least-loaded rank (ties: lowest
    rank, then input order), so Newton-Schulz work is balanced and the choice is identical
    on every rank without communication."""
    load = [0] * world
    owners = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: (-shapes[i][0] * shapes[i][1], i))
    for i in order:
        r = min(range(world), key=lambda k: (load[k], k))
        owners[i] = r
        # Newton-Schulz cost grows like rows * cols * min(rows, cols).
        load[r] += shapes[i][0] * shapes[i][1] * min(shapes[i][0], shapes[i][1])
    return owners


def traffic_bytes(shapes: Sequence[Sequence[int]], world: int, elem_bytes: int = 4, ns_elem_bytes: int | None = None) -> dict[str, Any]:
    """Bytes each rank sends to *other* ranks in one Muon step, per scheme.

    `all_to_all`: this module's scheme (shards to owners, results back).
    `all_gather`: every rank gathers every whole matrix (sends its shard to W - 1 ranks)."""
    ns_elem_bytes = elem_bytes if ns_elem_bytes is None else ns_elem_bytes
    owners = assign_owners(shapes, world)
    a2a = [0] * world
    gather = [0] * world
    for (rows, cols), owner in zip(shapes, owners):
        split = shard_rows(rows, world)
        for r in range(world):
            gather[r] += split[r] * cols * elem_bytes * (world - 1)
            if r != owner:
                a2a[r] += split[r] * cols * elem_bytes  # shard to the owner
                a2a[owner] += split[r] * cols * ns_elem_bytes  # its rows of the result back
    total_a2a, total_gather = sum(a2a), sum(gather)
    return {
        "world": world,
        "all_to_all_per_rank": a2a,
        "all_gather_per_rank": gather,
        "all_to_all_total": total_a2a,
        "all_gather_total": total_gather,
        "saving_factor": total_gather / total_a2a if total_a2a else float("inf"),
    }


def orthogonalize_sharded(
    shards: Sequence[Tensor],
    shapes: Sequence[Sequence[int]],
    *,
    group: Any,
    ns: Callable[[Tensor], Tensor],
) -> tuple[list[Tensor], dict[str, int]]:
    """Orthogonalize matrices held as dim-0 shards across `group`; returns this rank's
    shards of the results and the bytes it sent to other ranks in each collective.

    Every rank must call this with the same list of shapes in the same order."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    owners = assign_owners(shapes, world)
    splits = [shard_rows(rows, world) for rows, _ in shapes]
    for i, (s, (rows, cols)) in enumerate(zip(shards, shapes)):
        if tuple(s.shape) != (splits[i][rank], cols):
            raise ValueError(f"matrix {i}: local shard {tuple(s.shape)} is not FSDP2's dim-0 chunk {(splits[i][rank], cols)} of {(rows, cols)}")
    mine = [i for i, o in enumerate(owners) if o == rank]
    dtype, device = shards[0].dtype, shards[0].device

    # all_to_all #1: to rank d, my shards of the matrices d owns (in matrix order).
    send_parts = [[shards[i].reshape(-1) for i in range(len(shapes)) if owners[i] == d] for d in range(world)]
    in_splits = [sum(p.numel() for p in parts) for parts in send_parts]
    out_splits = [sum(splits[i][s] * shapes[i][1] for i in mine) for s in range(world)]
    send = torch.cat([p for parts in send_parts for p in parts]) if any(in_splits) else shards[0].new_zeros(0)
    recv = torch.empty(sum(out_splits), dtype=dtype, device=device)
    dist.all_to_all_single(recv, send.to(dtype), out_splits, in_splits, group=group)
    sent = {"all_to_all_1": (sum(in_splits) - in_splits[rank]) * send.element_size()}

    # Stack each owned matrix from its row blocks, source rank by source rank.
    pieces = list(recv.split(out_splits))
    whole: dict[int, Tensor] = {}
    for s in range(world):
        offset = 0
        for i in mine:
            n = splits[i][s] * shapes[i][1]
            whole.setdefault(i, [])  # type: ignore[arg-type]
            whole[i].append(pieces[s][offset : offset + n].view(splits[i][s], shapes[i][1]))  # type: ignore[attr-defined]
            offset += n
    results = {i: ns(torch.cat(whole[i], dim=0)) for i in mine}  # type: ignore[arg-type]
    out_dtype = next(iter(results.values())).dtype if results else _ns_dtype_probe(ns, dtype, device)

    # all_to_all #2: to rank d, its rows of each result I own.
    back_parts = []
    for d in range(world):
        for i in mine:
            start = sum(splits[i][:d])
            back_parts.append(results[i][start : start + splits[i][d]].reshape(-1))
    back_in = [sum(splits[i][d] * shapes[i][1] for i in mine) for d in range(world)]
    back_out = in_splits
    back_send = torch.cat(back_parts) if back_parts else torch.zeros(0, dtype=out_dtype, device=device)
    back_recv = torch.empty(sum(back_out), dtype=out_dtype, device=device)
    dist.all_to_all_single(back_recv, back_send.to(out_dtype).contiguous(), back_out, back_in, group=group)
    sent["all_to_all_2"] = (sum(back_in) - back_in[rank]) * back_recv.element_size()

    # Unpack my shards in the order they were sent.
    out: list[Tensor | None] = [None] * len(shapes)
    chunks = list(back_recv.split(back_out))
    for d in range(world):
        offset = 0
        for i in range(len(shapes)):
            if owners[i] != d:
                continue
            n = splits[i][rank] * shapes[i][1]
            out[i] = chunks[d][offset : offset + n].view(splits[i][rank], shapes[i][1])
            offset += n
    return [t for t in out if t is not None], sent  # every index was filled above


def _ns_dtype_probe(ns: Callable[[Tensor], Tensor], dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The output dtype of `ns` (a rank that owns no matrix must still agree on it)."""
    return ns(torch.eye(2, dtype=dtype, device=device)).dtype
