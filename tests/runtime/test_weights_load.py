"""Loading straight into the final form: int8 and bf16 models never exist in fp32 first,
the tied LM head is int8 too, and the fingerprints are those of loading then converting."""

from __future__ import annotations

import pytest
import torch

from agent.runtime import weights
from agent.runtime.checkpoint import LoadedModel, ModelLoadError, load_model_dir, save_model_dir
from agent.runtime.config import LaplaceConfig
from agent.runtime.model import build_model
from agent.runtime.quant import Int8Embedding, Int8Linear, quantize_int8_, quantize_loaded
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer

CONFIG = LaplaceConfig(name="ssd-q", vocab_size=264, d_model=64, n_layers=2, n_heads=8, head_k_dim=16, head_v_dim=16,
                       ffn_dim=96, mixer="ssd", qk_scale=False, d_skip=True, conv_bias=True, proj_bias=True, norm_eps=1e-5,
                       chunk_size=8, n_qk_heads=2, gate="rmsnorm", tie_embeddings=True)


@pytest.fixture()
def model_dir(tmp_path):
    lm = LoadedModel(build_model(CONFIG, seed=2).eval(), byte_level_tokenizer(), ChatTemplate(), name="ssd-q")
    return save_model_dir(lm, tmp_path / "m", card={"name": "ssd-q"})


def test_quantize_makes_every_matmul_int8_including_a_tied_head():
    model = quantize_int8_(build_model(CONFIG, seed=2).eval())
    assert type(model.lm_head) is Int8Linear and model.lm_head.out_features == CONFIG.vocab_size
    assert isinstance(model.embed, Int8Embedding) and model.embed.weight.dtype == torch.int8
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    # what stays float is small: norms, conv taps, decay and skip parameters
    assert all(p.dim() == 1 or name.endswith("conv.weight") for name, p in model.named_parameters())


def test_int8_load_reads_blocks_and_equals_quantizing_the_fp32_load(model_dir, monkeypatch):
    seen: list[tuple[str, tuple[int, ...]]] = []
    real = weights.blocks

    def spy(f, info, dtype, block_bytes=None, **kw):
        for r, block in real(f, info, dtype, block_bytes, **kw):
            seen.append((info.name, tuple(block.shape)))
            yield r, block

    monkeypatch.setattr("agent.runtime.fill.blocks", spy)
    monkeypatch.setattr(weights, "BLOCK_BYTES", 4096)  # 16 fp32 rows of 64
    direct = load_model_dir(model_dir, quant="int8")
    after = quantize_loaded(load_model_dir(model_dir), "int8")
    # every matrix was read in blocks of at most 4 KB of fp32, never whole
    assert {name for name, _ in seen} >= {"embed.weight", "blocks.0.attn.in_proj.weight", "blocks.1.ffn.w2.weight"}
    assert max(shape[0] * shape[1] * 4 for _, shape in seen) <= 4096
    assert direct.fingerprint == after.fingerprint and direct.card["weights"] == "int8"
    assert type(direct.model.lm_head) is Int8Linear and isinstance(direct.model.embed, Int8Embedding)
    assert not any(type(m) is torch.nn.Linear for m in direct.model.modules())
    ids = torch.randint(0, 264, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(direct.model(ids)[0], after.model(ids)[0], rtol=0, atol=0)


def test_bf16_and_fp32_loads_match_the_old_convert_after_loading(model_dir):
    fp32 = load_model_dir(model_dir)
    bf16 = load_model_dir(model_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    ref = build_model(CONFIG, seed=2).eval()
    for name, t in ref.state_dict().items():
        assert torch.equal(fp32.model.state_dict()[name], t)
        assert torch.equal(bf16.model.state_dict()[name], t.to(torch.bfloat16))
    old = LoadedModel(ref.to(torch.bfloat16), bf16.tokenizer, bf16.template, name="ssd-q")
    assert bf16.fingerprint == old.fingerprint  # the digest taken while reading is weights_digest's


def test_a_truncated_file_is_refused_before_reading(model_dir):
    f = model_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="unreadable.*truncated"):
        load_model_dir(model_dir, quant="int8")


def test_decode_layout_stores_the_tied_head_column_major_with_the_same_values(model_dir):
    plain = load_model_dir(model_dir)
    decode = load_model_dir(model_dir, decode_layout=True)
    w = decode.model.embed.weight
    assert w.shape == (CONFIG.vocab_size, CONFIG.d_model) and w.stride() == (1, CONFIG.vocab_size)
    assert torch.equal(w, plain.model.embed.weight) and plain.model.embed.weight.is_contiguous()
    assert decode.fingerprint == plain.fingerprint
    ids = torch.randint(0, 264, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(decode.model(ids)[0], plain.model(ids)[0], rtol=1e-5, atol=1e-5)


def test_decode_layout_fuses_qkv_and_gate_up_into_one_matrix_each(tmp_path):
    """The window mixer's q/k/v and each GLU's gate/up become views of one matrix (same
    values, names and fingerprint; no second copy), a step runs each group as one matmul
    with the same logits, and a LoRA-style wrapper or a replaced weight falls back."""
    from tests.runtime.test_window import window_model

    from agent.runtime.layers import project

    src = window_model(combine="softmax", vocab_size=264)  # the byte-level tokenizer's vocabulary
    d = save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})
    plain, decode = load_model_dir(d), load_model_dir(d, decode_layout=True)
    assert decode.fingerprint == plain.fingerprint
    attn, ffn = decode.model.blocks[0].attn, decode.model.blocks[0].ffn
    fused = attn.__dict__["_fused"][attn.FUSED][0]
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr() and attn.v_proj.weight.untyped_storage().data_ptr() == fused.data_ptr()
    assert ffn.w3.weight.untyped_storage().data_ptr() == ffn.__dict__["_fused"][ffn.FUSED][0].data_ptr()
    assert set(decode.model.state_dict()) == set(plain.model.state_dict())
    ids = torch.randint(0, 264, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, s_plain = plain.model(ids)
        got, s_dec = decode.model(ids)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        tok = torch.tensor([3])
        torch.testing.assert_close(decode.model.step_(tok, s_dec), plain.model.step_(tok, s_plain), rtol=1e-5, atol=1e-5)
    calls = []
    real = torch.nn.functional.linear
    x = torch.randn(1, src.config.d_model)
    try:
        torch.nn.functional.linear = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[assignment]
        project(attn, attn.FUSED, x)
        assert len(calls) == 1  # one matmul for three projections
        attn.k_proj.weight = torch.nn.Parameter(attn.k_proj.weight.detach().clone() * 0)  # replaced: no longer the view
        q, k, v = project(attn, attn.FUSED, x)
        assert len(calls) == 4 and torch.equal(k, torch.zeros_like(k))
    finally:
        torch.nn.functional.linear = real  # type: ignore[assignment]
