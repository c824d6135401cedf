"""A model kept in its file's dtype is memory-mapped, not read; its digest is cached beside
the file; and building the meta model no longer imports torch._dynamo (1-2 s a load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from agent.runtime import checkpoint, weights
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir, weights_digest
from agent.runtime.config import PRESETS
from agent.runtime.model import build_model
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer


@pytest.fixture()
def model_dir(tmp_path):
    lm = LoadedModel(build_model(PRESETS["tiny"], seed=3).eval(), byte_level_tokenizer(), ChatTemplate(), name="tiny")
    return save_model_dir(lm, tmp_path / "m", card={"name": "tiny"})


def _mapped_ranges(file) -> list[tuple[int, int]]:
    """Address ranges where this process maps `file` (Linux)."""
    out = []
    for line in open("/proc/self/maps", encoding="utf-8"):
        parts = line.split()
        if len(parts) >= 6 and parts[5] == str(file):
            a, b = (int(x, 16) for x in parts[0].split("-"))
            out.append((a, b))
    return out


def _in_file(t: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    return any(a <= t.data_ptr() < b for a, b in ranges)


def _file_bytes(d) -> bytes:
    return (d / "model.safetensors").read_bytes()


def test_fp32_weights_are_views_of_a_private_mapping(model_dir):
    before = _file_bytes(model_dir)
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs Linux's /proc/self/maps")
    lm = load_model_dir(model_dir)
    ranges = _mapped_ranges((model_dir / "model.safetensors").resolve())
    assert ranges and all(_in_file(p, ranges) for p in lm.model.parameters())  # views of the file: no copy
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(1.0)  # copy-on-write: the process gets its own pages ...
    assert _file_bytes(model_dir) == before  # ... and the file is never written
    again = load_model_dir(model_dir)
    assert again.fingerprint == load_model_dir(model_dir).fingerprint
    ref = LoadedModel(build_model(PRESETS["tiny"], seed=3).eval(), byte_level_tokenizer(), ChatTemplate(), name="tiny")
    for (name, a), (_, b) in zip(sorted(again.model.state_dict().items()), sorted(ref.model.state_dict().items())):
        assert torch.equal(a, b), name


def test_a_bf16_load_is_read_and_converted_not_mapped(model_dir):
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs Linux's /proc/self/maps")
    lm = load_model_dir(model_dir, dtype=torch.bfloat16)
    ranges = _mapped_ranges((model_dir / "model.safetensors").resolve())
    assert all(p.dtype == torch.bfloat16 and not _in_file(p, ranges) for p in lm.model.parameters())


def test_the_digest_is_cached_and_a_second_load_reads_no_weights(model_dir, monkeypatch):
    first = load_model_dir(model_dir)
    assert first.fingerprint == checkpoint.fingerprint(first.model, first.tokenizer, first.template)
    assert (model_dir / weights.DigestCache.NAME).is_file()

    class NoDigest:
        def __init__(self) -> None:
            raise AssertionError("the digest was computed although it is cached")

    monkeypatch.setattr(checkpoint, "Digest", NoDigest)
    second = load_model_dir(model_dir)
    assert second.fingerprint == first.fingerprint


def test_a_changed_file_misses_the_cache(model_dir):
    first = load_model_dir(model_dir)
    tensors = {k: v.clone() for k, v in first.model.state_dict().items()}
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1  # same names, shapes and size: only the bytes differ
    st = os.stat(model_dir / "model.safetensors")
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": checkpoint.MODEL_FORMAT})
    os.utime(model_dir / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime
    second = load_model_dir(model_dir)
    assert weights_digest(second.model) != weights_digest(first.model)
    assert second.fingerprint != first.fingerprint
    assert second.fingerprint == checkpoint.fingerprint(second.model, second.tokenizer, second.template)


def test_a_damaged_or_foreign_cache_is_ignored(model_dir):
    truth = load_model_dir(model_dir).fingerprint
    cache = model_dir / weights.DigestCache.NAME
    stale = {"file": "0:0:0:0:0", "digests": {"torch.float32": "0" * 64, "tokenizer": "0" * 64}}
    for text in ("not json", "[]", '{"model.safetensors": 3}',
                 json.dumps({"model.safetensors": stale, "tokenizer.json": stale})):
        cache.write_text(text)
        assert load_model_dir(model_dir).fingerprint == truth


def test_a_read_only_model_directory_still_loads(model_dir):
    (model_dir / weights.DigestCache.NAME).unlink(missing_ok=True)
    os.chmod(model_dir, 0o555)
    try:
        if os.access(model_dir, os.W_OK):  # root ignores the mode
            pytest.skip("this user can write a read-only directory")
        assert load_model_dir(model_dir).fingerprint
        assert not (model_dir / weights.DigestCache.NAME).exists()
    finally:
        os.chmod(model_dir, 0o755)


def test_loading_does_not_import_dynamo(model_dir):
    code = ("import sys; from agent.runtime.checkpoint import load_model_dir; "
            f"load_model_dir({str(model_dir)!r}); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_changed_tokenizer_misses_its_cached_digest(model_dir):
    first = load_model_dir(model_dir)
    assert "tokenizer.json" in json.loads((model_dir / weights.DigestCache.NAME).read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok["added_tokens"][-1]["content"] = "<|renamed|>"  # same size, another tokenizer
    (model_dir / "tokenizer.json").write_text(json.dumps(tok))
    second = load_model_dir(model_dir)
    assert second.fingerprint != first.fingerprint
    assert second.fingerprint == checkpoint.fingerprint(second.model, second.tokenizer, second.template)


def test_no_cache_is_written_into_the_packaged_models():
    from agent.runtime.checkpoint import PACKAGED_MODELS, load_model

    demo = PACKAGED_MODELS / "demo"
    if not (demo / "config.json").is_file():
        pytest.skip("no packaged demo model")
    (demo / weights.DigestCache.NAME).unlink(missing_ok=True)
    assert load_model("demo").fingerprint
    assert not (demo / weights.DigestCache.NAME).exists()


def test_the_decode_layout_head_is_a_copy_and_its_mapped_rows_are_given_back(model_dir):
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs Linux's /proc/self/maps")
    plain = load_model_dir(model_dir)
    lm = load_model_dir(model_dir, decode_layout=True)
    ranges = _mapped_ranges((model_dir / "model.safetensors").resolve())
    untied = lm.model.lm_head is not None
    head = lm.model.lm_head.weight if untied else lm.model.embed.weight  # tied: the embedding is the head
    same = plain.model.lm_head.weight if untied else plain.model.embed.weight
    assert head.stride() == (1, head.shape[0]) and not _in_file(head, ranges)
    assert torch.equal(head, same)  # the same values, and still readable after the release
    assert lm.fingerprint == plain.fingerprint
