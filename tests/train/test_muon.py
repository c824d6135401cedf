"""Our Muon against torch.optim.Muon, the Newton-Schulz dtype, and the lr scaling."""

from __future__ import annotations

import math

import pytest
import torch

from agent.train.muon import Muon, adjust_lr, newton_schulz
from agent.train.optim import build_optimizers, split_parameters
from agent.runtime.config import get_preset
from agent.runtime.model import build_model


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(48, 32, generator=g)), torch.nn.Parameter(torch.randn(24, 40, generator=g))]


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_matches_torch_muon_step_for_step_in_bf16(adjust: str) -> None:
    ours, ref = _params(0), _params(0)
    opt = Muon(ours, lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn=adjust, ns_dtype=torch.bfloat16)
    ref_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn=adjust)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for a, b in zip(ours, ref):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
        opt.step()
        ref_opt.step()
        for a, b in zip(ours, ref):
            assert torch.equal(a, b), "not bit-identical to torch.optim.Muon"


def test_fp32_newton_schulz_is_the_cpu_choice_and_orthogonalizes() -> None:
    model = build_model(get_preset("tiny"))
    muon = build_optimizers(split_parameters(model), muon_lr=0.02, adamw_lr=1e-3, device=torch.device("cpu"))[0]
    assert isinstance(muon, Muon) and muon.ns_dtype == torch.float32
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    o = newton_schulz(x)
    assert o.dtype == torch.float32 and o.shape == x.shape
    s = torch.linalg.svdvals(o)
    assert 0.5 < s.min() and s.max() < 1.5  # the quintic's documented band, not exactly 1
    # Close to the bf16 result (same iteration, better precision).
    assert torch.allclose(o, newton_schulz(x, dtype=torch.bfloat16).float(), atol=0.05)


def test_lr_adjustment_is_explicit() -> None:
    assert adjust_lr(0.01, "match_rms_adamw", (256, 1024)) == pytest.approx(0.01 * 0.2 * 32)
    assert adjust_lr(0.01, "original", (1024, 256)) == pytest.approx(0.02)
    assert adjust_lr(0.01, "original", (256, 1024)) == pytest.approx(0.01)
    assert adjust_lr(0.01, "none", (3, 4)) == 0.01
    with pytest.raises(ValueError):
        adjust_lr(0.01, "bogus", (3, 4))


def test_match_rms_update_has_adamw_like_rms() -> None:
    # The point of the scaling: an orthogonalized update times 0.2 sqrt(max(A, B)) has RMS ~0.2.
    o = newton_schulz(torch.randn(256, 128, generator=torch.Generator().manual_seed(2)))
    rms = float(o.pow(2).mean().sqrt()) * 0.2 * math.sqrt(256)
    assert 0.12 < rms < 0.28


def test_rejects_non_matrices() -> None:
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.zeros(4))])
