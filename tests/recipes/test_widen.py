"""widen_heads: a bigger state per head, the same model until it trains, and new dims that can train."""

from __future__ import annotations

import pytest
import torch

from recipes.default_model.widen import widen_heads
from agent.runtime.checkpoint import LoadedModel
from agent.runtime.config import get_preset
from agent.runtime.model import build_model
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer


def _trained_looking(seed: int = 3) -> LoadedModel:
    """A tiny model whose norms and gates are not at their init values (a trained model's are not)."""
    model = build_model(get_preset("tiny"), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "decay" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
            if "v_proj" in name:  # some heads' outputs tiny, as in the default model (the head norm's eps then matters)
                p.view(4, 32, -1)[0].mul_(1e-3)
    return LoadedModel(model, byte_level_tokenizer(), ChatTemplate(), name="tiny")


def test_widened_model_computes_the_same_logits_in_prefill_and_decode() -> None:
    lm = _trained_looking()
    wide = widen_heads(lm, 32, 64, seed=1)
    assert (wide.config.head_k_dim, wide.config.head_v_dim) == (32, 64)
    assert wide.config.parameters() > lm.config.parameters()
    ids = torch.randint(0, 264, (2, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, sa = lm.model(ids)
        b, sb = wide.model(ids)
        assert sb.gla.shape[-2:] == (32, 64) and sa.gla.shape[-2:] == (16, 32)
        assert torch.allclose(a, b, atol=1e-4)
        nxt = torch.tensor([[7], [9]])  # one decode step on each state
        assert torch.allclose(lm.model(nxt, sa)[0], wide.model(nxt, sb)[0], atol=1e-4)


def test_new_dims_get_gradients_from_the_first_step() -> None:
    wide = widen_heads(_trained_looking(), 32, 64, seed=1)
    ids = torch.randint(0, 264, (2, 40), generator=torch.Generator().manual_seed(0))
    logits, _ = wide.model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    attn = wide.model.blocks[0].attn
    q_new = attn.q_proj.weight.grad.view(4, 32, -1)[:, 16:]  # the zero-started rows of q
    norm_new = attn.head_norm.weight.grad[32:]  # the switched-off value dims
    assert q_new.abs().sum() > 0 and norm_new.abs().sum() > 0


def test_widening_is_seeded() -> None:
    lm = _trained_looking()
    a, b, c = (widen_heads(lm, 32, 64, seed=s).model.state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.k_proj.weight"], c["blocks.0.attn.k_proj.weight"])


@pytest.mark.parametrize(("k", "v"), [(8, 32), (16, 16), (16, 48)])
def test_shrinking_or_an_uneven_value_width_is_refused(k: int, v: int) -> None:
    with pytest.raises(ValueError, match="cannot widen heads of 16x32"):
        widen_heads(_trained_looking(), k, v)
