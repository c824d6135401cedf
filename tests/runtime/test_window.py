"""The window mixer (a Llama teacher's attention over sinks + a window, plus a GLA branch
over the evicted keys): the fast path against the slow per-query reference, and the
runtime's invariants (pieces == one pass, decode == prefill, save/load, padding, batches,
positions that never grow, fixed state size, the parameter arithmetic)."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.config import PRESETS, LaplaceConfig
from agent.runtime.generation import EagerRunner
from agent.runtime.info import count_on_meta
from agent.runtime.model import build_model
from agent.runtime.params import is_block_matrix
from agent.runtime.state import RecurrentState
from agent.runtime.window import hybrid_attention_naive, naive_forward, window_attention

TOL = 1e-4


def window_config(**kw) -> LaplaceConfig:
    base = dict(name="w", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_k_dim=8, head_v_dim=8,
                ffn_dim=48, chunk_size=8, norm_eps=1e-5, mixer="window", window=7, sinks=3, gla_branch=True,
                half_life_min=2.0, half_life_max=64.0, rope_theta=100.0, tie_embeddings=True)
    return LaplaceConfig(**{**base, **kw})


def window_model(seed: int = 0, mix: float = 0.5, **kw):
    """A random window model whose branch is on and far from its init (maps, decay, and
    log beta / gate), so the branch's part of every logit is large."""
    model = build_model(window_config(**kw), seed=seed).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for block in model.blocks:
            br = block.attn.gla_branch
            if br is None:
                continue
            for p in (br.q_map, br.k_map):
                if p is not None:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            br.decay_weight.copy_(torch.randn(br.decay_weight.shape, generator=gen) * 0.3)
            br.mix.fill_(mix)
    return model


GRID = [
    pytest.param(dict(combine="softmax"), id="softmax"),
    pytest.param(dict(combine="gated"), id="gated"),
    pytest.param(dict(combine="softmax", sinks=0), id="no-sinks"),
    pytest.param(dict(combine="gated", feature_map="elu"), id="gated-elu"),
    pytest.param(dict(gla_branch=False), id="window-only"),
    pytest.param(dict(combine="softmax", chunk_size=16, window=5, sinks=1, n_kv_heads=1), id="mqa-block16"),
]


@pytest.mark.parametrize("kw", GRID)
def test_fast_path_equals_the_per_query_reference(kw):
    """Sequences five times the window, with sinks, the branch on and nonzero."""
    model = window_model(**kw)
    ids = torch.randint(0, 64, (2, 41), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fast, _ = model(ids)
        ref = naive_forward(model, ids)
    torch.testing.assert_close(fast, ref, rtol=TOL, atol=TOL)


def test_the_branch_changes_the_logits_and_is_off_at_zero():
    """The grid above is not vacuous: the branch moves the logits well past the tolerance;
    with the gate at 0 the layer is the window-only teacher exactly."""
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        on, _ = window_model(combine="gated")(ids)
        zero, _ = window_model(combine="gated", mix=0.0)(ids)
        off, _ = window_model(gla_branch=False)(ids)
    assert (on - off).abs().max() > 100 * TOL
    assert torch.equal(zero, off)


@pytest.mark.parametrize("kw", GRID[:2] + GRID[4:5])
def test_pieces_save_load_then_decode_equals_one_pass(kw):
    model = window_model(**kw)
    ids = torch.randint(0, 64, (1, 45), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, full_state = model(ids)
        state, outs, pos = None, [], 0
        for n in (2, 5, 1, 17, 9):  # pieces shorter and longer than W + S, across the sinks
            logits, state = model(ids[:, pos : pos + n], state)
            outs.append(logits)
            pos += n
            blob = state.to_bytes(fingerprint="fp", architecture=model.config.architecture())
            state = RecurrentState.from_bytes(blob, config=model.config, fingerprint="fp")
        for t in range(pos, ids.shape[1]):
            logits, state = model(ids[:, t : t + 1], state)
            outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    assert state.names == full_state.names
    for name in state.names:
        torch.testing.assert_close(state.tensors[name], full_state.tensors[name], rtol=1e-5, atol=1e-5)
    assert int(state.pos) == 45 and state.n_tokens == 45


def test_decode_token_by_token_equals_chunked_prefill():
    model = window_model(combine="softmax")
    ids = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(6)).tolist()
    with torch.no_grad():
        last, chunked = EagerRunner(model, segment_len=16).prefill(ids)
        state, logits = model.new_state(1), None
        for t in ids:
            logits, state = model(torch.tensor([[t]]), state)
    torch.testing.assert_close(logits[:, -1], last, rtol=1e-5, atol=1e-5)
    for name in state.names:
        torch.testing.assert_close(state.tensors[name], chunked.tensors[name], rtol=1e-5, atol=1e-5)


def test_padded_rows_leave_the_state_as_unpadded():
    model = window_model(combine="gated")
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        _, prefix = model(ids[:, :12])  # a history, so the ring and branch are both in use
        _, short = model(ids[:1, 12:15], prefix.select(0))
        logits, padded = model(ids[:, 12:], prefix, lengths=torch.tensor([3, 12]), last_only=True)
        ref_logits, _ = model(ids[:1, 12:15], prefix.select(0))
    row = padded.select(0)
    for name in row.names:
        torch.testing.assert_close(row.tensors[name], short.tensors[name])
    torch.testing.assert_close(logits[0, 0], ref_logits[0, -1], rtol=1e-5, atol=1e-5)
    assert padded.pos.tolist() == [[15, 24]]


def test_batched_rows_at_different_positions_decode_as_alone():
    model = window_model(combine="softmax")
    gen = torch.Generator().manual_seed(8)
    a, b = torch.randint(0, 64, (1, 5), generator=gen), torch.randint(0, 64, (1, 33), generator=gen)
    with torch.no_grad():
        _, sa = model(a)
        _, sb = model(b)
        both = RecurrentState.stack([sa, sb]).padded_to(4)  # and two empty rows at position 0
        tok = torch.tensor([[7], [9], [0], [0]])
        lb, s_both = model(tok, both)
        la, s_a = model(tok[:1], sa)
        lbb, s_b = model(tok[1:2], sb)
    torch.testing.assert_close(lb[0], la[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lb[1], lbb[0], rtol=1e-5, atol=1e-5)
    for name in s_a.names:
        torch.testing.assert_close(s_both.select(1).tensors[name], s_b.tensors[name], rtol=1e-5, atol=1e-5)
    assert s_both.pos.tolist() == [[6, 34, 1, 1]]


def test_positions_never_grow_a_long_session_decodes_as_a_short_one():
    """Past S + W the layer depends on the ring's contents, never on the absolute position:
    a state moved 10^6 windows later (same ring slots) gives the same logits in fp32."""
    model = window_model(combine="gated")
    ids = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        _, state = model(ids)
        far = state.clone()
        far.tensors["pos"] = far.pos + 10**6 * model.config.window
        near_logits, _ = model(torch.tensor([[5, 6, 7]]), state)
        far_logits, far_after = model(torch.tensor([[5, 6, 7]]), far)
    torch.testing.assert_close(far_logits, near_logits, rtol=1e-5, atol=1e-5)
    assert int(far_after.pos) == 30 + 3 + 10**6 * 7


def test_window_beyond_the_sequence_is_plain_causal_attention():
    """With W + S >= T nothing is evicted and the sinks are at their true distances: the
    kernel is ordinary causal softmax attention with RoPE (what the teacher computes)."""
    gen = torch.Generator().manual_seed(10)
    B, T, H, G, D = 2, 20, 4, 2, 8
    q, k, v = (torch.randn(B, T, n, D, generator=gen) for n in (H, G, G))
    num, den, *_ = window_attention(q, k, v, torch.zeros(B, G, 24, D), torch.zeros(B, G, 24, D), torch.zeros(B, dtype=torch.long),
                                    None, window=20, sinks=4, theta=100.0, block=8)
    from agent.runtime.window import rope

    pos = torch.arange(T)
    qr, kr = rope(q.transpose(1, 2), pos, 100.0), rope(k.transpose(1, 2).repeat_interleave(2, 1), pos, 100.0)
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, v.transpose(1, 2).repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(num / den[..., None], ref.transpose(1, 2), rtol=1e-5, atol=1e-5)
    naive = hybrid_attention_naive(q, k, v, window=20, sinks=4, theta=100.0)
    torch.testing.assert_close(naive, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_without_sinks_the_window_is_a_masked_full_attention():
    """S = 0, T several times W: a sliding-window mask over ordinary causal attention at
    true positions (no sink rule to apply), computed by SDPA in one call."""
    gen = torch.Generator().manual_seed(11)
    B, T, H, G, D, W = 2, 30, 4, 2, 8, 5
    q, k, v = (torch.randn(B, T, n, D, generator=gen) for n in (H, G, G))
    ring = torch.zeros(B, G, W, D)
    num, den, *_ = window_attention(q, k, v, ring, ring, torch.zeros(B, dtype=torch.long), None, window=W, sinks=0,
                                    theta=100.0, block=4)
    from agent.runtime.window import rope

    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    pos = torch.arange(T)
    qr, kr = rope(q.transpose(1, 2), pos, 100.0), rope(k.transpose(1, 2).repeat_interleave(2, 1), pos, 100.0)
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, v.transpose(1, 2).repeat_interleave(2, 1),
                                                           attn_mask=(j <= i) & (j > i - W))
    torch.testing.assert_close(num / den[..., None], ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_state_is_fixed_size_and_the_arithmetic_is_exact():
    model = window_model(combine="softmax")
    cfg = model.config
    with torch.no_grad():
        _, s1 = model(torch.randint(0, 64, (1, 3)))
        _, s2 = model(torch.randint(0, 64, (1, 50)))
    assert s1.nbytes == s2.nbytes == cfg.state_bytes()
    for c in (cfg, cfg.replace(gla_branch=False), cfg.replace(combine="gated", feature_map="elu"), PRESETS["smollm2-135m-window"]):
        total, muon = count_on_meta(c)
        assert total == c.parameters() and muon == c.muon_parameters()
    # SmolLM2-135M at W = 256, S = 4: ring 30 x 2 x 3 x 260 x 64 x 4 B, branch 30 x 9 x 128 x 65 x 4 B, positions 8 B
    smol = PRESETS["smollm2-135m-window"]
    assert smol.state_bytes() == 11_980_800 + 8_985_600 + 8
    assert smol.parameters() - smol.branch_parameters_per_layer() * smol.n_layers == 134_515_008  # the teacher's count


def test_branch_parameters_are_separable_and_never_muon():
    model = build_model(window_config(), device="meta")
    names = [n for n, _ in model.named_parameters() if ".gla_branch." in n]
    assert sorted({n.split(".gla_branch.")[1] for n in names}) == ["decay_bias", "decay_weight", "k_map", "log_beta", "q_map"]
    assert all(n.startswith("blocks.") and ".attn.gla_branch." in n for n in names)
    assert not any(is_block_matrix(n, p) for n, p in model.named_parameters() if ".gla_branch." in n)
    gated = build_model(window_config(combine="gated"), device="meta")
    assert "blocks.0.attn.gla_branch.gate" in dict(gated.named_parameters())


def test_config_round_trips_and_names_its_architecture():
    cfg = window_config()
    assert LaplaceConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.architecture() == "window/L2/H4x8/KV2/W7/S3/gla-hedgehog16-softmax"
    assert cfg.replace(gla_branch=False).architecture().endswith("/nogla")
    assert "window" not in PRESETS["tiny"].to_dict()  # the new switches stay out of older configs
    assert {"combine", "feature_map", "rope_theta", "gla_branch"} <= set(cfg.to_dict())  # a window model spells its own out
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        window_config(n_kv_heads=3)
    with pytest.raises(ValueError, match="combine"):
        window_config(combine="sum")


# ---- the lean decode step (window_decode.py) against forward ----------------------------


@pytest.mark.parametrize("kw", GRID)
def test_lean_step_equals_forward_token_by_token(kw):
    """From an empty state through the sinks, the first window, its wrap and a second epoch
    (3 W + S tokens), two rows at different positions: step_ (in place) == forward at T = 1,
    in the logits and in every state tensor."""
    model = window_model(**kw)
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        _, a = model(torch.randint(0, 64, (1, 4), generator=gen))
        both = RecurrentState.stack([a, model.new_state(1)])  # rows at positions 4 and 0
        ref, lean = both, both.clone()
        for _ in range(3 * model.config.window + model.config.sinks):
            tok = torch.randint(0, 64, (2,), generator=gen)
            want, ref = model(tok[:, None], ref)
            got = model.step_(tok, lean)
            torch.testing.assert_close(got, want[:, 0], rtol=1e-5, atol=1e-5)
    assert lean.names == ref.names and lean.pos.tolist() == ref.pos.tolist()
    assert lean.allclose(ref, rtol=1e-5, atol=1e-5)


def test_lean_step_far_into_a_session_equals_near():
    """Positions 10^6 windows on (same ring slots): the step's tables and angles only see
    the slot, so a far state decodes exactly as the near one, and as forward does."""
    model = window_model(combine="gated")
    with torch.no_grad():
        _, near = model(torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(14)))
        far = near.clone()
        far.tensors["pos"] = far.pos + 10**6 * model.config.window
        far.n_tokens = int(far.pos)
        ref = far.clone()
        for t in (5, 6, 7):
            tok = torch.tensor([t])
            assert torch.equal(model.step_(tok, far), model.step_(tok, near))
            want, ref = model(tok[:, None], ref)
        torch.testing.assert_close(model.step_(torch.tensor([8]), far), model(torch.tensor([[8]]), ref)[0][:, 0], rtol=1e-5, atol=1e-5)
    assert int(far.pos) == far.n_tokens == 30 + 4 + 10**6 * 7


def test_ring_keys_are_rotated_once_to_their_slot():
    """The ring stores rope(k, slot): rotating it back gives the un-rotated keys the
    reference reads (here: the last W keys of a sequence past the first wrap)."""
    from agent.runtime.window import rotate_ring_keys

    model = window_model(gla_branch=False)
    cfg = model.config
    ids = torch.randint(0, 64, (1, 25), generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        _, state = model(ids)
        h = model.blocks[0].attn_norm(model.embed(ids))
        k = model.blocks[0].attn.k_proj(h).view(1, 25, cfg.kv_heads, cfg.head_k_dim)
    raw = rotate_ring_keys(state.win_k[0], cfg.rope_theta, sign=-1)  # [1, G, S + W, D]
    for p in list(range(cfg.sinks)) + list(range(25 - cfg.window, 25)):
        slot = p if p < cfg.sinks else cfg.sinks + (p - cfg.sinks) % cfg.window
        torch.testing.assert_close(raw[0, :, slot], k[0, p], rtol=1e-5, atol=1e-5)

