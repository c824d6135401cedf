"""Weight files: safetensors (single or sharded), or a pytorch_model.bin read as tensors only."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from agent.importers import import_checkpoint
from agent.importers.source import CheckpointError, load_weights
from tests.importers.helpers import llamba_checkpoint


def test_sharded_safetensors_load_whole(tmp_path) -> None:
    llamba_checkpoint(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for f, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / f))
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    got = load_weights(tmp_path)
    assert sorted(got) == names and all(torch.equal(got[k], tensors[k]) for k in names)
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing weight shards b.safetensors"):
        load_weights(tmp_path)


def test_a_torch_bin_of_tensors_imports(tmp_path) -> None:
    tensors = llamba_checkpoint(tmp_path / "src")
    (tmp_path / "src" / "model.safetensors").unlink()
    torch.save(tensors, tmp_path / "src" / "pytorch_model.bin")
    lm = import_checkpoint(tmp_path / "src", tmp_path / "out", name="b")
    assert torch.equal(lm.model.blocks[0].attn.D, tensors["backbone.layers.0.mixer.D"])


class Payload:
    """Stands for any object a pickle could carry (and run code while loading)."""


def test_a_torch_bin_with_objects_is_refused(tmp_path) -> None:
    llamba_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "note": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot be read as plain tensors"):
        load_weights(tmp_path)
    torch.save({"w": torch.zeros(2), "n": 3}, tmp_path / "pytorch_model.bin")  # loads, but is not all tensors
    with pytest.raises(CheckpointError, match="not a dict of tensors"):
        load_weights(tmp_path)
