"""The role split (every parameter in exactly one group) and the schedules."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.config import get_preset
from agent.runtime.model import build_model
from agent.train.optim import build_optimizers, lr_factor, set_learning_rates, split_parameters


def test_3b_split_matches_the_published_muon_share() -> None:
    config = get_preset("laplace-3b")
    split = split_parameters(build_model(config, device="meta"))
    assert split.muon_numel == 2_717_908_992
    assert split.adamw_numel == config.adamw_parameters()
    assert "2,717,908,992" in split.describe()


def test_every_parameter_in_exactly_one_group() -> None:
    model = build_model(get_preset("tiny"))
    split = split_parameters(model)
    names = [n for n, _ in split.muon + split.adamw]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    muon = {n for n, _ in split.muon}
    assert "blocks.0.attn.q_proj.weight" in muon and "blocks.1.ffn.w2.weight" in muon
    for n in ("embed.weight", "lm_head.weight", "blocks.0.attn.conv.weight", "blocks.0.attn.decay_weight", "norm.weight"):
        assert n not in muon
    assert split_parameters(model, use_muon=False).muon == []


def test_frozen_parameters_are_left_out_and_optimizers_share_base_lrs() -> None:
    model = build_model(get_preset("tiny"))
    model.embed.weight.requires_grad_(False)
    split = split_parameters(model)
    assert "embed.weight" not in {n for n, _ in split.adamw}
    opts = build_optimizers(split, muon_lr=0.02, adamw_lr=1e-3, weight_decay=0.1)
    set_learning_rates(opts, 0.5)
    assert opts[0].param_groups[0]["lr"] == pytest.approx(0.01)
    assert [g["lr"] for g in opts[1].param_groups] == pytest.approx([5e-4, 5e-4])
    # no weight decay on norms, gains, gates or embeddings
    no_decay = [g for g in opts[1].param_groups if g["weight_decay"] == 0.0][0]["params"]
    assert all(p.dim() < 2 for p in no_decay)


@pytest.mark.parametrize("schedule", ["wsd", "cosine"])
def test_schedules_warm_up_then_decay_but_never_to_zero(schedule: str) -> None:
    f = [lr_factor(s, 100, schedule=schedule, warmup=10) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(b <= a + 1e-12 for a, b in zip(f[10:], f[11:]))
    assert 0 < f[-1] < 0.1
    if schedule == "wsd":
        assert f[10:80] == [1.0] * 70  # stable until the last 20%
    with pytest.raises(ValueError):
        lr_factor(0, 10, schedule="linear")


def test_split_asserts_on_a_parameter_in_no_group() -> None:
    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(2))

        def named_parameters(self, *args, **kwargs):  # hides `a` from the split's walk
            return iter([])

        def parameters(self, recurse: bool = True):
            return iter([self.a])

    with pytest.raises(AssertionError, match="no optimizer group"):
        split_parameters(Odd())
