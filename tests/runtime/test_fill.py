"""Loading in place (`runtime/fill.py`): each weight read straight into the tensor it runs
in (fused q/k/v and gate/up rows, int8 rows, the column-major head), with the numbers of
the old path (load, convert, then fuse in memory), and no float copy of an int8 weight
left anywhere in the process."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from agent.runtime import weights
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.layers import fuse_linears_
from agent.runtime.quant import Int8Linear, quantize_int8_
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from tests.runtime.test_window import window_model

MODES = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, None), "int8": (torch.float32, "int8")}


@pytest.fixture()
def model_dir(tmp_path):
    src = window_model(combine="softmax", vocab_size=264)  # tied head; the byte-level tokenizer's vocabulary
    return save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})


def old_path(mode: str) -> nn.Module:
    """What a decode-layout load used to build: the whole model in memory, converted, then
    its FUSED Linears copied together (and, for int8, quantized after)."""
    dtype, quant = MODES[mode]
    model = window_model(combine="softmax", vocab_size=264).to(dtype)
    if quant is None:  # the tied head column-major (int8's head is its own row-major Linear)
        model.embed.weight = nn.Parameter(model.embed.weight.detach().t().contiguous().t())
    for m in model.modules():
        if hasattr(m, "FUSED"):
            assert fuse_linears_(m, m.FUSED)
    return quantize_int8_(model) if quant else model


@pytest.mark.parametrize("mode", list(MODES))
def test_a_load_in_place_gives_the_old_paths_logits_and_states_bit_for_bit(model_dir, mode, monkeypatch):
    monkeypatch.setattr(weights, "BLOCK_BYTES", 512)  # many blocks per matrix, through one scratch buffer
    dtype, quant = MODES[mode]
    new = load_model_dir(model_dir, dtype=dtype, quant=quant, decode_layout=True).model
    old = old_path(mode)
    ids = torch.randint(0, 264, (1, 19), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        (want, s_old), (got, s_new) = old(ids), new(ids)
        assert torch.equal(got, want)
        assert s_new.tensors.keys() == s_old.tensors.keys()
        assert all(torch.equal(s_new.tensors[k], s_old.tensors[k]) for k in s_old.tensors)
        tok = torch.tensor([7])
        assert torch.equal(new.step_(tok, s_new), old.step_(tok, s_old))


@pytest.mark.parametrize("mode", list(MODES))
def test_fused_weights_are_read_into_their_matrix_never_copied_together(model_dir, mode, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a load copied separately read weights together")

    monkeypatch.setattr("agent.runtime.layers.fuse_int8_", refuse)  # the copy fuse_linears_ makes (int8's too)
    monkeypatch.setattr(torch, "cat", refuse)
    dtype, quant = MODES[mode]
    model = load_model_dir(model_dir, dtype=dtype, quant=quant, decode_layout=True).model
    owners = [m for m in model.modules() if hasattr(m, "FUSED")]
    assert len(owners) == 4  # two layers: q/k/v and gate/up each
    for m in owners:
        fused, mods, _, _ = m.__dict__["_fused"][m.FUSED]
        matrix = fused.weight if isinstance(fused, Int8Linear) else fused
        assert matrix.dtype == (torch.int8 if quant else dtype)
        assert all(getattr(m, n).weight.untyped_storage().data_ptr() == matrix.untyped_storage().data_ptr() for n in m.FUSED)
        assert matrix.untyped_storage().nbytes() == matrix.numel() * matrix.element_size()  # nothing else in it


def _float_tensors_reachable(model: nn.Module) -> list[torch.Tensor]:
    out = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    for m in model.modules():
        for v in m.__dict__.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                out.append(v)
        for fused, *_ in m.__dict__.get("_fused", {}).values():
            if isinstance(fused, torch.Tensor) and fused.is_floating_point():
                out.append(fused)
    return out


def test_no_float_copy_of_an_int8_weight_survives_the_load(model_dir):
    model = load_model_dir(model_dir, quant="int8", decode_layout=True).model
    int8 = [t for t in model.buffers() if t.dtype == torch.int8]
    assert int8 and all(type(m) is not nn.Linear for m in model.modules())
    shapes = {tuple(t.shape) for t in int8} | {tuple(t.shape[::-1]) for t in int8}
    # Held by the model: only small float tensors (norms, scales, the branch's maps and decay).
    small = max(t.numel() for t in _float_tensors_reachable(model))
    assert small < min(t.numel() for t in int8 if t.dim() == 2)
    # Held by anything: no float tensor of a quantized matrix's shape is alive in the process.
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) in (torch.Tensor, nn.Parameter) and o.is_floating_point() and tuple(o.shape) in shapes
             and o.numel() > 64]
    assert alive == []


def test_blocks_are_read_into_the_callers_scratch_and_convert_as_they_are_copied(model_dir):
    path = model_dir / "model.safetensors"
    with open(path, "rb") as f:
        infos = weights.read_header(f)
        info = infos["embed.weight"]  # 264 x 32 fp32
        scratch = torch.empty(4096, dtype=torch.uint8)
        lo, hi = scratch.data_ptr(), scratch.data_ptr() + scratch.numel()
        seen = [(r, b.shape[0]) for r, b in weights.blocks(f, info, info.dtype, 1024, scratch=scratch) if lo <= b.data_ptr() < hi]
        assert seen == [(r, 8) for r in range(0, 264, 8)]  # every block in the scratch, none elsewhere
        whole = weights.read_tensor(f, info, torch.float32)
        bf16 = weights.read_tensor(f, info, torch.bfloat16, scratch=scratch)
        col = weights.read_tensor(f, info, torch.bfloat16, column_major=True, scratch=scratch)
    assert torch.equal(bf16, whole.to(torch.bfloat16)) and torch.equal(col, bf16) and col.stride() == (1, 264)
