"""recipes/smollm2_hybrid: the combine-mode measurement trains the very branch the model runs, and
its texts are the machine's own and the same on every run."""

from __future__ import annotations

import torch

from agent.runtime.state import RecurrentState
from recipes.smollm2_hybrid.train.attention import branch_output, layer_cache
from recipes.smollm2_hybrid.text import TEXTS
from tests.runtime.test_window import window_model


def test_branch_output_is_the_layer_the_model_runs():
    model = window_model(combine="softmax")
    attn = model.blocks[0].attn
    h = torch.randn(30, model.config.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = layer_cache(attn, h)
        y = branch_output(attn, cache)
        layer = {n: t[0] for n, t in RecurrentState.zeros(model.config).tensors.items() if n != "pos"}
        out, _ = attn(h[None], layer, None, torch.zeros(1, dtype=torch.long))
        torch.testing.assert_close(attn.o_proj(y.reshape(1, 30, -1)), out, rtol=1e-5, atol=1e-6)
        full = window_model(combine="softmax", window=30).blocks[0].attn  # the same weights, a window past T
        assert full.config.window >= 30
        expect, _ = full(h[None], {n: t[0] for n, t in RecurrentState.zeros(full.config).tensors.items() if n != "pos"},
                         None, torch.zeros(1, dtype=torch.long))
        torch.testing.assert_close(attn.o_proj(cache["target"].reshape(1, 30, -1)), expect, rtol=1e-5, atol=1e-6)


def test_texts_are_deterministic_english():
    for make in TEXTS.values():
        text = make(5000)
        assert len(text) >= 5000 and text == make(5000) and text.count(" the ") > 20
