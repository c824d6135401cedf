"""The lean decode step (`LaplaceModel.step_`, in place) against the reference: the model's
own `forward` at T = 1, which builds a new stacked state every token."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.generation import EagerRunner, Generation
from agent.runtime.gla import gla_step, gla_step_
from agent.runtime.model import build_model
from agent.runtime.sampling import SamplingOptions
from agent.runtime.state import RecurrentState

SSD = dict(name="ssd-t", vocab_size=264, d_model=32, n_layers=2, n_heads=8, head_k_dim=16, head_v_dim=8, ffn_dim=0,
           mixer="ssd", qk_scale=False, d_skip=True, conv_bias=True, norm_eps=1e-5, chunk_size=8)
CONFIGS = {
    "gla": PRESETS["tiny"],
    "ssd-rmsnorm-2groups": LaplaceConfig(**SSD, n_qk_heads=2, gate="rmsnorm", norm_groups=2),
    "ssd-silu-llamba": LaplaceConfig(**{**SSD, "ffn_dim": 48}, n_qk_heads=4, gate="silu", conv_activation="identity",
                                     v_times_dt=False, tie_embeddings=True),
    "window-gla-branch": LaplaceConfig(name="win-t", vocab_size=264, d_model=32, n_layers=2, n_heads=4, head_k_dim=8,
                                       head_v_dim=8, ffn_dim=48, chunk_size=8, norm_eps=1e-5, mixer="window", window=7,
                                       sinks=3, gla_branch=True, n_kv_heads=2, tie_embeddings=True),
}


@pytest.mark.parametrize("groups", [1, 2, 8], ids=lambda g: f"groups{g}")
@pytest.mark.parametrize("scale", [None, 1.0], ids=["scaled", "unscaled"])
def test_gla_step_in_place_equals_gla_step(groups, scale):
    gen = torch.Generator().manual_seed(1)
    B, H, K, V = 2, 8, 16, 12
    q, k = (torch.randn(B, groups, K, generator=gen) for _ in range(2))
    v = torch.randn(B, H, V, generator=gen)
    g = -torch.rand(B, H, generator=gen) * 3
    s0 = torch.randn(B, H, K, V, generator=gen)
    rep = lambda x: x.repeat_interleave(H // groups, dim=1)[:, None]  # noqa: E731
    o_ref, s_ref = gla_step(rep(q), rep(k), v[:, None], g[:, None], s0, scale=scale)
    s = s0.clone()
    o = gla_step_(q, k, v, g.exp(), s, scale=scale)
    torch.testing.assert_close(o, o_ref[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_step_in_place_equals_forward_token_by_token(name):
    model = build_model(CONFIGS[name], seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 264, (2, 11), generator=gen)
    steps = torch.randint(0, 264, (2, 9), generator=gen)
    with torch.inference_mode():
        _, ref = model(prompt)
        lean = ref.clone()
        for t in range(steps.shape[1]):
            want, ref = model(steps[:, t : t + 1], ref)
            got = model.step_(steps[:, t], lean)
            torch.testing.assert_close(got, want[:, 0], rtol=1e-5, atol=1e-5)
    assert lean.names == ref.names
    assert lean.allclose(ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gla", "ssd-rmsnorm-2groups"])
def test_step_writes_the_given_tensors_and_step_leaves_its_input(name):
    model = build_model(CONFIGS[name], seed=3).eval()
    runner = EagerRunner(model)
    with torch.inference_mode():
        _, state = runner.prefill(list(range(20)))
        before = state.clone()
        ptrs = {n: t.data_ptr() for n, t in state.tensors.items()}
        _, new = runner.step(torch.tensor([5]), state)
        assert state.max_abs_diff(before) == 0.0  # the functional form copies
        assert new.n_tokens == state.n_tokens + 1
        runner.step_(torch.tensor([5]), state)
        assert {n: t.data_ptr() for n, t in state.tensors.items()} == ptrs  # written, not replaced
        assert state.max_abs_diff(new) == 0.0 and state.n_tokens == new.n_tokens


def test_generation_steps_its_own_copy_and_matches_replay():
    model = build_model(CONFIGS["ssd-rmsnorm-2groups"], seed=3).eval()
    runner = EagerRunner(model)
    with torch.inference_mode():
        logits, state = runner.prefill(list(range(30)))
    given = state.clone()
    gen = Generation(runner, state, logits, SamplingOptions(temperature=0.0, max_new_tokens=12))
    tokens = list(gen)
    final = gen.finish()
    assert state.max_abs_diff(given) == 0.0  # the caller's state is untouched
    _, replay = runner.prefill(list(range(30)) + tokens)
    assert final.n_tokens == replay.n_tokens == 42
    assert final.allclose(replay, rtol=1e-4, atol=1e-5)


def test_state_blob_from_lean_steps_loads_with_the_legacy_layout():
    model = build_model(CONFIGS["ssd-rmsnorm-2groups"], seed=3).eval()
    runner = EagerRunner(model)
    with torch.inference_mode():
        _, state = runner.prefill([1, 2, 3])
        runner.step_(torch.tensor([4]), state)
    blob = state.to_bytes(fingerprint="f" * 64)
    back = RecurrentState.from_bytes(blob, config=model.config, fingerprint="f" * 64)
    assert back.meta["format_version"] == "1" and back.max_abs_diff(state) == 0.0


def test_a_step_that_fails_part_way_leaves_the_state_of_the_tokens_before_it():
    model = build_model(CONFIGS["gla"], seed=3).eval()
    runner = EagerRunner(model)
    with torch.inference_mode():
        logits, state = runner.prefill(list(range(10)))
    real, calls = runner.step_, {"n": 0}

    def flaky(tokens, st):
        calls["n"] += 1
        if calls["n"] == 3:
            st.tensors["gla"][1].add_(1.0)  # one layer written, then the failure
            raise RuntimeError("fell over")
        return real(tokens, st)

    runner.step_ = flaky
    gen = Generation(runner, state, logits, SamplingOptions(temperature=0.0, max_new_tokens=8))
    with pytest.raises(RuntimeError, match="fell over"):
        list(gen)
    runner.step_ = real
    final = gen.finish()  # folds the token whose step failed, this time whole
    _, replay = runner.prefill(list(range(10)) + gen.tokens)
    assert len(gen.tokens) == 3 and final.n_tokens == replay.n_tokens
    assert final.allclose(replay, rtol=1e-4, atol=1e-5)
