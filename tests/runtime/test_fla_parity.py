"""Dev-only parity with flash-linear-attention's naive Simple-GLA references.

`fla-core` (the `dev` extra; pure Python, needs only einops) ships
`fla/ops/simple_gla/naive.py`. Its package `__init__` pulls in Triton kernels, so the file
is loaded on its own by path. Skipped when fla-core is not installed.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from agent.runtime.gla import gla_chunked, gla_step

pytest.importorskip("einops")
_spec = importlib.util.find_spec("fla")
if _spec is None or not _spec.submodule_search_locations:
    pytest.skip("fla-core is not installed (pip install -e '.[dev]')", allow_module_level=True)
_path = Path(list(_spec.submodule_search_locations)[0]) / "ops" / "simple_gla" / "naive.py"
_mod_spec = importlib.util.spec_from_file_location("fla_simple_gla_naive", _path)
fla_naive = importlib.util.module_from_spec(_mod_spec)
_mod_spec.loader.exec_module(fla_naive)


def _inputs(T: int, H: int, K: int, V: int):
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, T, H, K, generator=gen), torch.randn(2, T, H, K, generator=gen) / math.sqrt(K)
    v = torch.randn(2, T, H, V, generator=gen)
    half = torch.tensor([2048 ** (h / max(H - 1, 1)) for h in range(H)])
    g = (-math.log(2) / half).expand(2, T, H).clone()
    s0 = torch.randn(2, H, K, V, generator=gen)
    return q, k, v, g, s0


@pytest.mark.parametrize("T,H,K,V", [(64, 2, 16, 32), (200, 4, 96, 192)], ids=["small", "3b-head"])
def test_matches_fla_recurrent_reference(T, H, K, V):
    q, k, v, g, s0 = _inputs(T, H, K, V)
    o_ref, s_ref = fla_naive.naive_recurrent_simple_gla(q, k, v, g, initial_state=s0.clone(), output_final_state=True)
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=64)
    torch.testing.assert_close(o, o_ref.to(o.dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)


def test_matches_fla_chunk_reference_and_step():
    q, k, v, g, s0 = _inputs(128, 4, 32, 64)
    o_ref, s_ref = fla_naive.naive_chunk_simple_gla(q, k, v, g, initial_state=s0.clone(), output_final_state=True, chunk_size=32)
    o, s = gla_chunked(q, k, v, g, s0, chunk_size=32)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
    o1, _ = gla_step(q[:, :1], k[:, :1], v[:, :1], g[:, :1], s0)
    torch.testing.assert_close(o1, o_ref[:, :1], rtol=1e-5, atol=1e-5)
