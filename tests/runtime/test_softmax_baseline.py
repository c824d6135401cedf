"""The softmax baseline: its KV cache must give the same logits as one causal pass."""

from __future__ import annotations

import torch

from agent.runtime.config import PRESETS
from agent.runtime.softmax import KVCache, SoftmaxModel


def test_kv_cache_pieces_equal_one_pass():
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    model = SoftmaxModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 30))
    full = model(ids)
    cache = KVCache(cfg, 2, 64)
    outs = [model(ids[:, :9], cache), model(ids[:, 9:20], cache)]
    outs += [model(ids[:, t : t + 1], cache) for t in range(20, 30)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 30
    assert cache.nbytes_used == cfg.n_layers * 2 * 2 * cfg.d_model * 30 * 4  # grows per token
