"""int8 weight-only inference: close to fp32, its own fingerprint, refused where it cannot run."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.checkpoint import load_model
from agent.runtime.config import PRESETS
from agent.runtime.model import build_model
from agent.runtime.quant import quantize_int8_, quantize_loaded


def test_int8_logits_stay_close_to_fp32() -> None:
    config = PRESETS["ssd-1b"].replace(d_model=256, n_layers=2, n_heads=4, head_k_dim=16, head_v_dim=64, ffn_dim=512, vocab_size=512)
    ref = build_model(config, seed=1).eval()
    q = quantize_int8_(build_model(config, seed=1).eval())
    assert not any(type(m) is torch.nn.Linear for m in q.modules())  # every Linear was replaced
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, _ = ref(ids)
        b, _ = q(ids)
    rel = ((a - b).norm() / a.norm()).item()
    assert 0 < rel < 0.15  # changed (it really is int8), but only by quantization noise (a wrong matmul is ~1.4)


def test_quantized_model_has_its_own_fingerprint() -> None:
    fp32 = load_model("tiny")
    q = quantize_loaded(load_model("tiny"), "int8")
    assert q.fingerprint != fp32.fingerprint and len(q.fingerprint) == 64
    assert q.card["weights"] == "int8"


def test_unknown_mode_and_bf16_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize_loaded(load_model("tiny"), "int4")
    with pytest.raises(ValueError, match="fp32 models on the CPU"):
        quantize_loaded(load_model("tiny", dtype=torch.bfloat16), "int8")


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_the_window_models_lean_step_equals_its_forward_in_int8_and_bf16(dtype: str) -> None:
    """The default model's mixer in the other dtypes `laplace bench dtype` compares: every
    matmul int8 (the tied head and the embedding too) or bf16 weights; step_ == forward."""
    from tests.runtime.test_window import window_model

    model = window_model(combine="softmax")
    if dtype == "int8":
        model = quantize_int8_(model)
        assert type(model.embed).__name__ == "Int8Embedding" and model.lm_head is not None  # the tied head is int8 too
    else:
        model = model.to(torch.bfloat16)
    tol = 1e-5 if dtype == "int8" else 2e-2
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        _, ref = model(torch.randint(0, 64, (1, 12), generator=gen))
        lean = ref.clone()
        for _ in range(10):
            tok = torch.randint(0, 64, (1,), generator=gen)
            want, ref = model(tok[:, None], ref)
            torch.testing.assert_close(model.step_(tok, lean).float(), want[:, 0].float(), rtol=tol, atol=tol)
    assert lean.allclose(ref, rtol=tol, atol=tol)


def _with_outlier_channels(model: torch.nn.Module) -> torch.nn.Module:
    """Three channels of every pre-norm 40x larger: the Linears they feed then see the
    per-channel activation outliers SmolLM2 has (issue 35), weights unchanged."""
    with torch.no_grad():
        for block in model.blocks:
            for norm in (block.attn_norm, block.ffn_norm):
                if norm is not None:
                    norm.weight[:3] *= 40.0
    return model


@pytest.mark.parametrize("family", ["window", "ssd", "gla"])
def test_int8_stays_close_to_fp32_under_activation_outliers_where_per_token_int8_did_not(family: str) -> None:
    import copy
    import warnings

    from tests.runtime.test_window import window_model

    if family == "window":
        ref = window_model()
    elif family == "ssd":
        ref = build_model(PRESETS["ssd-1b"].replace(d_model=256, n_layers=2, n_heads=4, head_k_dim=16, head_v_dim=64, ffn_dim=512,
                                                    vocab_size=512), seed=1).eval()
    else:
        ref = build_model(PRESETS["tiny"], seed=1).eval()
    ref = _with_outlier_channels(ref)
    with warnings.catch_warnings():  # the old scheme: fbgemm dynamic int8, activations one scale per token
        warnings.simplefilter("ignore")
        old = torch.ao.quantization.quantize_dynamic(copy.deepcopy(ref), {torch.nn.Linear}, dtype=torch.qint8)
    new = quantize_int8_(copy.deepcopy(ref))
    ids = torch.randint(0, ref.embed.weight.shape[0], (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want, _ = ref(ids)
        rel = [((want - m(ids)[0]).norm() / want.norm()).item() for m in (old, new)]
    assert rel[1] < 0.1 and rel[0] > 0.15 and rel[0] > 3 * rel[1], rel  # measured: old 0.19-0.65, new 0.03-0.07


@pytest.mark.parametrize("bf16_gemm", [False, True], ids=["fp32-gemm", "bf16-gemm"])
@pytest.mark.parametrize("k", [48, 40])
def test_int8_linear_gives_the_same_numbers_for_few_rows_and_many(k: int, bf16_gemm: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many rows run the widened-weight GEMM in blocks of rows (made small here, so a matrix
    spans several), few rows the int8 kernel: with bf16 activations where K is a multiple of
    16 (its vector loops read 16 at a time: K = 40 read past each row, and crashed from 2
    rows on), in fp32 otherwise. All are x @ (q * scale).T, the bf16 forms to bf16 rounding.
    The GEMM widens to fp32, or (a CPU with bf16 dot products) to bf16 with bf16 activations."""
    from agent.runtime import quant

    monkeypatch.setattr(quant, "_GEMM_BLOCK", 24 * k)  # 24 rows a block: 70 rows span 3
    monkeypatch.setattr(quant, "BF16_GEMM", bf16_gemm)
    gen = torch.Generator().manual_seed(3)
    lin = torch.nn.Linear(k, 70)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(70, k, generator=gen))
        lin.bias.copy_(torch.randn(70, generator=gen))
    q8 = quant.linear_to_int8(lin)
    w = q8.weight.float() * q8.scale[:, None]
    x = torch.randn(2, quant.GEMM_ROWS, k, generator=gen)
    many = q8(x)
    assert many.shape == (2, quant.GEMM_ROWS, 70)
    if bf16_gemm:  # the sums rounded to bf16 (8 bits): within 2^-8 of the bf16 inputs' product
        want = (x.bfloat16().float() @ w.t())
        torch.testing.assert_close(many, want + q8.bias, rtol=8e-3, atol=1e-2)
        assert not torch.allclose(many, x @ w.t() + q8.bias, rtol=1e-5, atol=1e-5)  # it is the bf16 form
    else:
        torch.testing.assert_close(many, x @ w.t() + q8.bias, rtol=1e-5, atol=1e-5)
    xr = x.bfloat16().float() if k % 16 == 0 else x  # what the few-row form multiplies
    for rows in (1, 2, 3, 5):
        few = q8(x[:, :rows])
        torch.testing.assert_close(few, xr[:, :rows] @ w.t() + q8.bias, rtol=1e-2, atol=5e-2)
    assert (many - lin(x)).abs().max() > 0  # it really is int8


@pytest.mark.parametrize("path", ["quantize", "load"])
def test_int8_projections_fuse_for_decode_as_fp32_ones_do(path: str, tmp_path) -> None:
    """A decode-layout int8 model runs q/k/v and gate/up as one int8 matmul each (quantized
    from a fused fp32 model, whose fused fp32 matrix is then dropped, or read from a file),
    with the numbers of the separate int8 Linears."""
    from agent.runtime.checkpoint import load_model_dir, save_model_dir
    from agent.runtime.layers import project
    from agent.runtime.quant import Int8Linear
    from tests.runtime.test_window import window_model

    if path == "quantize":
        from agent.runtime.layers import fuse_linears_

        model = window_model()
        for m in model.modules():
            if hasattr(m, "FUSED"):
                assert fuse_linears_(m, m.FUSED)
        model = quantize_int8_(model)
    else:
        save_model_dir(load_model("tiny"), tmp_path / "m")
        model = load_model_dir(tmp_path / "m", quant="int8", decode_layout=True).model
    owners = [m for m in model.modules() if hasattr(m, "FUSED")]
    assert owners
    for m in owners:
        fused, mods, _, _ = m.__dict__["_fused"][m.FUSED]
        assert type(fused) is Int8Linear and all(type(getattr(m, n)) is Int8Linear for n in m.FUSED)
        x = torch.randn(1, 3, fused.in_features)
        for got, n in zip(project(m, m.FUSED, x), m.FUSED):
            torch.testing.assert_close(got, getattr(m, n)(x), rtol=1e-5, atol=1e-5)


def test_int8_linear_over_a_weight_at_an_odd_offset_is_still_right() -> None:
    """The int8 kernel's vector loads want 16-byte aligned weight rows: a view that starts
    one byte in takes the scalar form instead of faulting."""
    from agent.runtime.quant import Int8Linear, quantize_rows

    gen = torch.Generator().manual_seed(4)
    q, scale = quantize_rows(torch.randn(40, 48, generator=gen))
    store = torch.empty(40 * 48 + 1, dtype=torch.int8)
    store[1:] = q.flatten()
    lin = Int8Linear(store[1:].view(40, 48), scale, None)
    assert lin.weight.data_ptr() % 16 != 0
    x = torch.randn(3, 48, generator=gen)
    torch.testing.assert_close(lin(x), x @ (q.float() * scale[:, None]).t(), rtol=1e-4, atol=1e-4)
