"""A GGUF's tensors are read one at a time as the converter takes them: reading the file
dequantizes nothing, the conversion reads each tensor once, and what it reads equals the
reader's own view of the file (dequantized, q/k rows un-permuted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from agent.importers.gguf_source import _hf_name, read_gguf, unpermute
from agent.importers.llama import HybridOptions, hybrid_weights

from .llama_helpers import llama_gguf


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    llama_gguf(path)  # Q8_0 embeddings, Q4_1 attention, Q4_0 / Q8_0 GLU, F32 norms
    return path


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import gguf.quants

    calls: list[str] = []
    real = gguf.quants.dequantize

    def counted(data, kind):  # type: ignore[no-untyped-def]
        calls.append(kind.name)
        return real(data, kind)

    monkeypatch.setattr(gguf.quants, "dequantize", counted)
    return calls


def test_reading_a_gguf_dequantizes_nothing_and_converting_reads_each_tensor_once(gguf_path, monkeypatch):
    calls = _counting(monkeypatch)
    g = read_gguf(gguf_path)
    assert calls == []  # nothing held yet: the old reader had every tensor in fp32 here
    n = len(g.tensors)
    _, ours = hybrid_weights(g.shape, g.tensors, HybridOptions(window=16, sinks=2), name="t")
    assert len(calls) == n and len(g.tensors) == 0  # each read once, then forgotten by the source
    assert all(v.dtype == torch.float32 and v.is_contiguous() for v in ours.values())


def test_tensors_read_from_the_file_equal_the_readers_view(gguf_path):
    import gguf
    from gguf.quants import dequantize

    g = read_gguf(gguf_path)
    reader = gguf.GGUFReader(str(gguf_path))
    kinds = set()
    for t in reader.tensors:
        kinds.add(t.tensor_type.name)
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(tuple(reversed(t.shape.tolist())))
        if t.name.endswith("attn_q.weight"):
            want = unpermute(want, g.shape.n_heads)
        elif t.name.endswith("attn_k.weight"):
            want = unpermute(want, g.shape.n_kv_heads)
        got = g.tensors.pop(_hf_name(t.name, g.shape.n_layers))
        assert torch.equal(got, torch.from_numpy(np.array(want, dtype=np.float32, order="C"))), t.name
    assert {"F32", "Q8_0", "Q4_1", "Q4_0"} <= kinds
    with pytest.raises(KeyError):
        g.tensors.pop("model.norm.weight")
