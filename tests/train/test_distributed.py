"""Distributed Muon and FSDP2 training on real gloo process groups (2 and 4 ranks)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from agent.runtime.checkpoint import load_model
from agent.runtime.config import get_preset
from agent.runtime.model import build_model
from agent.train.config import TrainConfig
from agent.train.dist_muon import assign_owners, shard_rows, traffic_bytes
from agent.train.loop import Trainer
from agent.train.muon import newton_schulz
from agent.train.optim import split_parameters
from tests.train import dist_worker


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shard_rows_and_owners() -> None:
    assert shard_rows(5, 4) == [2, 2, 1, 0] and shard_rows(3, 4) == [1, 1, 1, 0] and sum(shard_rows(264, 8)) == 264
    owners = assign_owners([(64, 32), (5, 3), (7, 4)], 4)
    assert owners[0] == 0 and len(set(owners)) == 3  # one rank owns nothing


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_newton_schulz_is_bit_identical(tmp_path: Path, world: int) -> None:
    mp.spawn(dist_worker.newton_schulz_worker, args=(world, _port(), str(tmp_path)), nprocs=world)
    expected = [newton_schulz(m) for m in dist_worker.ns_inputs()]
    counted = traffic_bytes(dist_worker.NS_SHAPES, world)
    for rank in range(world):
        got = torch.load(tmp_path / f"ns_{rank}.pt", weights_only=True)
        for i, (shard, full) in enumerate(zip(got["shards"], expected)):
            sizes = shard_rows(full.shape[0], world)
            assert torch.equal(shard, full[sum(sizes[:rank]) : sum(sizes[: rank + 1])]), (rank, i)
        # the bytes really sent are what the accounting function says
        assert sum(got["sent"].values()) == counted["all_to_all_per_rank"][rank]


def test_traffic_saving_grows_with_ranks() -> None:
    shapes = [tuple(p.shape) for _, p in split_parameters(build_model(get_preset("laplace-3b"), device="meta")).muon]
    factors = {w: traffic_bytes(shapes, w)["saving_factor"] for w in (2, 4, 8, 64)}
    assert factors[2] == pytest.approx(1.0, rel=0.01)
    assert factors[4] == pytest.approx(2.0, rel=0.01) and factors[8] == pytest.approx(4.0, rel=0.01)
    assert factors[64] > 24  # the published 24x at 64 cores, reached by this scheme


def _run(data: Path, out: Path, **kw) -> dict:
    return dict(data=[str(data)], out=str(out), steps=3, seq_len=32, batch_tokens=256, lr=3e-3, warmup=1, **kw)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_training_matches_single_process_and_resumes_exactly(tmp_path: Path, text_dir: Path, world: int) -> None:
    runs = [
        _run(text_dir, tmp_path / "whole"),
        _run(text_dir, tmp_path / "part", stop_after=2),
        _run(text_dir, tmp_path / "part", resume=str(tmp_path / "part")),
    ]
    mp.spawn(dist_worker.train_worker, args=(world, _port(), runs, str(tmp_path)), nprocs=world)
    ranks = [json.loads((tmp_path / f"train_{r}.json").read_text()) for r in range(world)]
    whole, part, rest = ranks[0]
    assert all(r[0]["losses"] == whole["losses"] for r in ranks)  # ranks agree on the loss

    single = Trainer(TrainConfig(**{**_run(text_dir, tmp_path / "single"), "data": (str(text_dir),)}))
    single.run()
    assert whole["losses"] == pytest.approx([m["loss"] for m in single.history], rel=1e-4)
    a, b = load_model(str(tmp_path / "whole")), load_model(str(tmp_path / "single"))
    for (n, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), n

    # resume from the distributed checkpoint: the same next step as the uninterrupted run
    assert part["losses"] + rest["losses"] == whole["losses"]
    # measured bytes per step == the accounting function for this model's matrices
    shapes = [tuple(p.shape) for _, p in split_parameters(build_model(get_preset("tiny"), device="meta")).muon]
    counted = traffic_bytes(shapes, world)["all_to_all_per_rank"]
    for rank, r in enumerate(ranks):
        assert all(sum(step.values()) == counted[rank] for step in r[0]["comm"])
