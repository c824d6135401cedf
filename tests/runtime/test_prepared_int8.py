"""An int8 load keeps the rows and scales it made beside the weights file, and the next load
maps them instead of reading the fp32 file and quantizing it again (issue 35: most of
`laplace ask -c`'s model load). What runs must be exactly what quantizing makes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from agent.runtime import checkpoint, fill, weights
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.quant import QUANT_SCHEME, Int8Linear
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from tests.runtime.test_window import window_model


@pytest.fixture()
def model_dir(tmp_path):
    """A window model: its q/k/v and gate/up are fused for decode, its head tied or not."""
    lm = LoadedModel(window_model(seed=5, vocab_size=264), byte_level_tokenizer(), ChatTemplate(), name="w")
    return save_model_dir(lm, tmp_path / "m", card={"name": "w"})


def _cache(d):
    return d / f".laplace-{QUANT_SCHEME}.safetensors"


def _count_blocks(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = weights.blocks

    def spy(f, info, dtype, block_bytes=None, **kw):
        seen.append(info.name)
        yield from real(f, info, dtype, block_bytes, **kw)

    monkeypatch.setattr(fill, "blocks", spy)
    return seen


def _same(a: LoadedModel, b: LoadedModel) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert a.fingerprint == b.fingerprint
    ids = torch.randint(0, 264, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(a.model(ids)[0], b.model(ids)[0], rtol=0, atol=0)


def test_a_second_int8_load_maps_the_rows_the_first_made(model_dir, monkeypatch):
    seen = _count_blocks(monkeypatch)
    first = load_model_dir(model_dir, quant="int8", decode_layout=True)
    assert seen and _cache(model_dir).is_file()
    with safe_open(str(_cache(model_dir)), "pt") as f:  # a valid safetensors file, keyed to its source
        assert f.metadata()["scheme"] == QUANT_SCHEME
        assert f.metadata()["source"] == weights.file_identity(model_dir / "model.safetensors")
    seen.clear()
    second = load_model_dir(model_dir, quant="int8", decode_layout=True)
    assert seen == []  # no int8 matrix read from the fp32 file, nor quantized
    _same(first, second)
    for m in second.model.modules():
        if type(m) is Int8Linear:  # the kernel's aligned form still applies to the mapped rows
            assert m.weight.data_ptr() % 16 == 0
    fused = [m for m in second.model.modules() if m.__dict__.get("_fused")]
    assert fused  # q/k/v and gate/up still run as one int8 matmul each
    # and a plain (not decode-layout) load from the cache equals quantizing afresh
    _same(load_model_dir(model_dir, quant="int8"), checkpoint.quantize_loaded(load_model_dir(model_dir), "int8"))


def test_a_hit_copies_fused_rows_into_their_matrix_and_gives_the_mapping_back(model_dir, monkeypatch):
    first = load_model_dir(model_dir, quant="int8", decode_layout=True)
    released: list[str] = []
    real_release = weights.MappedFile.release

    def refuse(*a, **k):
        raise AssertionError("a load copied separately held rows together")

    with monkeypatch.context() as mp:  # only while loading: a forward pass may concatenate
        mp.setattr(weights.MappedFile, "release", lambda self, info: (released.append(info.name), real_release(self, info)))
        mp.setattr(torch, "cat", refuse)
        second = load_model_dir(model_dir, quant="int8", decode_layout=True)
    _same(first, second)
    owners = [(n, m) for n, m in second.model.named_modules() if m.__dict__.get("_fused")]
    assert owners
    for owner_name, m in owners:
        fused, mods, _, _ = m.__dict__["_fused"][m.FUSED]
        storage = fused.weight.untyped_storage()
        assert storage.nbytes() == fused.weight.numel()  # its own matrix, not the cache's mapping
        assert all(getattr(m, n).weight.untyped_storage().data_ptr() == storage.data_ptr() for n in m.FUSED)
        for n in m.FUSED:  # the cache's rows and scales it was copied from were given back
            assert {f"{owner_name}.{n}.weight", f"{owner_name}.{n}.scale"} <= set(released)
    assert not any(name.startswith("embed.") for name in released)  # a view of the mapping: kept


def test_a_changed_weights_file_misses_the_int8_cache(model_dir, monkeypatch):
    first = load_model_dir(model_dir, quant="int8")
    plain = load_model_dir(model_dir)
    tensors = {k: v.clone() for k, v in plain.model.state_dict().items()}
    tensors["blocks.0.ffn.w2.weight"] = tensors["blocks.0.ffn.w2.weight"].flip(1)  # same names and shapes
    st = os.stat(model_dir / "model.safetensors")
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": checkpoint.MODEL_FORMAT})
    os.utime(model_dir / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime
    seen = _count_blocks(monkeypatch)
    second = load_model_dir(model_dir, quant="int8")
    assert "blocks.0.ffn.w2.weight" in seen
    assert not torch.equal(second.model.blocks[0].ffn.w2.weight, first.model.blocks[0].ffn.w2.weight)
    _same(second, checkpoint.quantize_loaded(load_model_dir(model_dir), "int8"))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other scheme", "missing tensor"])
def test_a_damaged_or_foreign_int8_cache_is_ignored(model_dir, damage):
    truth = load_model_dir(model_dir, quant="int8")
    path = _cache(model_dir)
    if damage == "garbage":
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        with safe_open(str(path), "pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys() if not k.startswith("__pad__")}
        if damage == "other scheme":
            meta = {**meta, "scheme": "int8-rows-v0"}
        else:
            tensors.pop(sorted(tensors)[0])
        save_file(tensors, str(path), metadata=meta)
    _same(load_model_dir(model_dir, quant="int8"), truth)
    with safe_open(str(path), "pt") as f:  # the miss wrote a good cache again
        assert f.metadata()["scheme"] == QUANT_SCHEME


def test_an_int8_load_without_a_cached_digest_reads_the_file(model_dir, monkeypatch):
    """The fingerprint needs the fp32 weights' digest: with it lost, the int8 rows are read
    (and the digest computed) again rather than trusted without it."""
    load_model_dir(model_dir, quant="int8")
    (model_dir / weights.DigestCache.NAME).unlink()
    seen = _count_blocks(monkeypatch)
    again = load_model_dir(model_dir, quant="int8")
    assert seen and json.loads((model_dir / weights.DigestCache.NAME).read_text())
    _same(again, checkpoint.quantize_loaded(load_model_dir(model_dir), "int8"))


def test_the_fp32_load_writes_no_int8_cache(model_dir):
    load_model_dir(model_dir, decode_layout=True)
    assert not _cache(model_dir).exists()


def test_no_int8_cache_is_written_into_the_packaged_models():
    demo = checkpoint.PACKAGED_MODELS / "demo"
    if not (demo / "config.json").is_file():
        pytest.skip("no packaged demo model")
    assert checkpoint.load_model("demo", quant="int8").fingerprint
    assert not _cache(demo).exists()
