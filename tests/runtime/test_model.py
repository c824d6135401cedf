"""The runtime's core invariant and the model's published shape."""

from __future__ import annotations

import math

import pytest
import torch

from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.generation import EagerRunner
from agent.runtime.info import count_on_meta
from agent.runtime.model import build_model
from agent.runtime.state import RecurrentState


@pytest.fixture(scope="module")
def tiny():
    return build_model(PRESETS["tiny"], seed=0).eval()


def test_3b_preset_matches_published_numbers_on_meta():
    cfg = PRESETS["laplace-3b"]
    total, muon = count_on_meta(cfg)
    assert muon == 2_717_908_992
    assert f"{total / 1e9:.3f}" == "3.028"
    assert total == cfg.parameters()  # arithmetic agrees with the built module
    assert round((total - muon) / 1e6, 1) == 309.6
    assert cfg.state_bytes() == 29_491_200
    assert round(cfg.kv_cache_bytes(8192) / cfg.state_bytes()) == 82


def test_half_life_schedule_is_geometric_and_gate_bias_realises_it(tiny):
    cfg = LaplaceConfig(name="t", vocab_size=16, d_model=32, n_layers=1, n_heads=16, head_k_dim=2, head_v_dim=2, ffn_dim=8)
    hl = cfg.half_lives()
    assert hl[0] == pytest.approx(1.0) and hl[-1] == pytest.approx(2048.0)
    ratios = [b / a for a, b in zip(hl, hl[1:])]
    assert max(ratios) == pytest.approx(min(ratios))
    g = torch.nn.functional.logsigmoid(torch.tensor(cfg.gate_biases())) / cfg.gate_normalizer
    # after h tokens a head keeps exactly half: exp(h * g) = 0.5
    assert torch.allclose((torch.tensor(hl) * g).exp(), torch.full((16,), 0.5), atol=1e-6)
    # and the model's freshly initialised gate uses exactly that schedule
    attn = tiny.blocks[0].attn
    g_model = attn.log_decay(torch.randn(1, 3, tiny.config.d_model))
    expect = torch.tensor([-math.log(2) / h for h in tiny.config.half_lives()])
    assert torch.allclose(g_model[0, 0], expect, rtol=1e-5)


@pytest.mark.parametrize("pieces", [[5, 11, 1, 40], [64], [17, 47]], ids=["uneven", "one-chunk", "two"])
def test_pieces_then_steps_with_save_load_equals_one_pass(tiny, pieces):
    torch.manual_seed(0)
    total = sum(pieces) + 12
    ids = torch.randint(0, tiny.config.vocab_size, (1, total))
    full_logits, full_state = tiny(ids)
    state, outs, pos = None, [], 0
    for n in pieces:
        logits, state = tiny(ids[:, pos : pos + n], state)
        outs.append(logits)
        pos += n
    blob = state.to_bytes(fingerprint="fp")  # save and load in the middle
    state = RecurrentState.from_bytes(blob, config=tiny.config, fingerprint="fp")
    assert state.n_tokens == pos
    for t in range(pos, total):
        logits, state = tiny(ids[:, t : t + 1], state)
        outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.gla, full_state.gla, rtol=1e-5, atol=1e-5)
    assert state.n_tokens == total


def test_segmented_prefill_equals_one_pass(tiny):
    ids = torch.randint(0, tiny.config.vocab_size, (100,)).tolist()
    full_logits, full_state = tiny(torch.tensor([ids]))
    seen = []
    logits, state = EagerRunner(tiny, segment_len=32).prefill(ids, progress=lambda d, t: seen.append((d, t)))
    torch.testing.assert_close(logits, full_logits[:, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.conv, full_state.conv)
    assert seen[-1] == (100, 100) and len(seen) == 4


def test_padded_positions_leave_state_untouched(tiny):
    ids = torch.randint(0, tiny.config.vocab_size, (2, 24))
    _, s_short = tiny(ids[:1, :9])
    logits, s_pad = tiny(ids, lengths=torch.tensor([9, 24]), last_only=True)
    torch.testing.assert_close(s_pad.select(0).gla, s_short.gla)
    torch.testing.assert_close(s_pad.select(0).conv, s_short.conv)
    ref_logits, _ = tiny(ids[:1, :9])
    torch.testing.assert_close(logits[0, 0], ref_logits[0, -1], rtol=1e-5, atol=1e-5)


def test_forward_never_mutates_its_input_state(tiny):
    state = tiny.new_state(1)
    _, state = tiny(torch.tensor([[1, 2, 3]]), state)
    before = state.clone()
    tiny(torch.tensor([[4, 5]]), state)
    assert torch.equal(before.gla, state.gla) and torch.equal(before.conv, state.conv)


def test_state_is_fixed_size_whatever_the_length(tiny):
    _, s1 = tiny(torch.randint(0, 200, (1, 10)))
    _, s2 = tiny(torch.randint(0, 200, (1, 300)))
    assert s1.nbytes == s2.nbytes == PRESETS["tiny"].state_bytes()


def test_bf16_weights_keep_fp32_state():
    model = build_model(PRESETS["tiny"], dtype=torch.bfloat16).eval()
    logits, state = model(torch.randint(0, 200, (1, 20)))
    assert logits.dtype == torch.bfloat16
    assert state.gla.dtype == torch.float32 and state.conv.dtype == torch.float32
    assert torch.isfinite(logits.float()).all()


def test_training_gradients_flow_through_all_parameters(tiny):
    model = build_model(PRESETS["tiny"], seed=1)
    ids = torch.randint(0, 200, (2, 40))
    logits, _ = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == []


def test_laplace_info_and_the_optimizer_split_count_the_same_muon_parameters() -> None:
    """One rule (`agent.runtime.params.is_block_matrix`) for `laplace info` and the optimizer grouping."""
    from agent.runtime.config import get_preset
    from agent.train.optim import split_parameters

    cfg = get_preset("tiny")
    assert count_on_meta(cfg)[1] == split_parameters(build_model(cfg, device="meta")).muon_numel


def test_block_and_model_never_ask_which_mixer_they_hold():
    """One mixer interface (mixers.py): model.py names no mixer class, dispatches on no
    type and special-cases no state tensor by name; every mixer declares its state."""
    import inspect

    from agent.runtime import model as model_module
    from agent.runtime.config import PRESETS
    from agent.runtime.mixers import MIXERS

    src = inspect.getsource(model_module)
    assert "isinstance" not in src and '"pos"' not in src
    assert not any(cls.__name__ in src for cls in MIXERS.values())
    for cls in MIXERS.values():
        assert callable(cls.step_) and callable(cls.state_spec) and isinstance(cls.uses_positions, bool)
    assert set(PRESETS["tiny"].state_spec()) == {"gla", "conv"}  # a position-free mixer's state has no positions
