"""The window mixer's bounded memory of evicted tokens (agent/runtime/memory.py): the
selection rule, the fast path and the lean step against the per-query reference, and the
runtime's invariants with the memory on (pieces + save/load == one pass, decode == chunked
prefill, padded and batched rows, the teacher exactly within S + W, a fixed state)."""

from __future__ import annotations

import random

import pytest
import torch

from agent.runtime.generation import EagerRunner
from agent.runtime.memory import EMPTY, NOVELTY_SPAN, admit, novelty
from agent.runtime.state import RecurrentState
from agent.runtime.window import naive_forward
from tests.runtime.test_window import window_model

TOL = 1e-4
NW = NOVELTY_SPAN + 4  # "novelty" models' window: keys past the span after a leaving token, so twins can count

GRID = [
    pytest.param(dict(memory_slots=4, memory_policy="attention", gla_branch=False), id="attention-window-only"),
    pytest.param(dict(memory_slots=4, memory_policy="attention", combine="softmax"), id="attention-softmax"),
    pytest.param(dict(memory_slots=3, memory_policy="recall", combine="softmax"), id="recall-softmax"),
    pytest.param(dict(memory_slots=5, memory_policy="recall", combine="gated", n_kv_heads=1), id="recall-gated-mqa"),
]
NOVELTY = [
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW), id="novelty-window-only"),
    pytest.param(dict(memory_slots=3, memory_policy="novelty", combine="gated", n_kv_heads=1, window=NW), id="novelty-gated-mqa"),
]
GRID += NOVELTY
# A memory in some layers only (`memory_layers`): the others are the window alone.
SOME_LAYERS = [
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=(1,)), id="novelty-layer-1"),
    pytest.param(dict(memory_slots=3, memory_policy="recall", combine="softmax", memory_layers=(0,)), id="recall-layer-0"),
    # and a second group in the layers it leaves out, with its own slot count (`memory_rest_slots`)
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=(1,), memory_rest_slots=2),
                 id="novelty-layer-1-rest-2"),
    pytest.param(dict(memory_slots=3, memory_policy="recall", combine="softmax", memory_layers=(0,), memory_rest_slots=5),
                 id="recall-layer-0-rest-5"),
]
GRID += SOME_LAYERS
# The memory read at a distance of its own (`memory_distance`), past the window's W.
FAR = [
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_distance=2 * NW + 3), id="novelty-read-far"),
    pytest.param(dict(memory_slots=3, memory_policy="attention", combine="softmax", memory_distance=40), id="attention-read-far"),
    # each group at its own distance (`memory_rest_distance`): layer 1 far, layer 0 at the window's edge
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=(1,), memory_rest_slots=2,
                      memory_distance=2 * NW + 3, memory_rest_distance=NW), id="novelty-groups-read-apart"),
]
GRID += FAR


def wide(policy: str) -> dict:
    """The window a policy's test model takes: NW for "novelty", the preset's otherwise."""
    return {"window": NW} if policy == "novelty" else {}


def test_admit_keeps_the_best_m_of_the_stream_in_position_order():
    """Random scores arriving in blocks of random sizes: after each block the memory is the
    M best (score, position) so far, sorted by position, empty slots first and zero; alive
    says which candidates each step's query reads."""
    rng = random.Random(0)
    M, D = 5, 3
    mem = {"mem_k": torch.zeros(1, 1, M, D), "mem_v": torch.zeros(1, 1, M, D),
           "mem_score": torch.zeros(1, 1, M), "mem_pos": torch.zeros(1, 1, M, dtype=torch.long)}
    seen: list[tuple[float, int]] = []
    pos = 1
    for c in (1, 3, 2, 7, 1, 4):
        scores = [rng.choice([0.5, rng.random()]) for _ in range(c)]  # ties too
        ok = [rng.random() > 0.2 for _ in range(c)]
        p = torch.arange(pos, pos + c)
        k = p.float()[None, None, :, None].expand(1, 1, c, D)  # the key says whose it is
        _, _, alive, mem = admit(mem, k, k + 0.5, torch.tensor(scores)[None, None], p[None], torch.tensor(ok)[None])
        for i in range(c):
            if ok[i]:
                seen.append((scores[i], pos + i))
            if i == c - 1:
                held = sorted(q for _, q in sorted(seen, reverse=True)[:M])
                assert mem["mem_pos"][0, 0].tolist() == [EMPTY] * (M - len(held)) + held
                assert mem["mem_k"][0, 0, :, 0].tolist() == [0.0] * (M - len(held)) + [float(q) for q in held]
            # alive at step i covers the best M among what had arrived by then
            arrived = sorted([x for x in seen if x[1] <= pos + i], reverse=True)[:M]
            assert int(alive[0, 0, :, i].sum()) == len(arrived), i
        pos += c


@pytest.mark.parametrize("kw", GRID)
def test_fast_path_with_memory_equals_the_per_query_reference(kw):
    """Sequences six times the window: the memory fills, and its slots turn over."""
    model = window_model(**kw)
    ids = torch.randint(0, 64, (2, 45), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fast, state = model(ids)
        ref = naive_forward(model, ids)
    torch.testing.assert_close(fast, ref, rtol=TOL, atol=TOL)
    assert (state.tensors["mem_pos"] != EMPTY).all()  # full by now


@pytest.mark.parametrize("kw", GRID[:3] + NOVELTY[:1])
def test_the_memory_changes_the_logits_only_past_s_plus_w(kw):
    """Within S + W the memory holds nothing and the model is the window-only teacher
    exactly; past it the memory moves the logits well beyond the tolerance."""
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(4))
    on, off = window_model(**kw), window_model(**{**kw, "memory_slots": 0})
    c = on.config
    with torch.no_grad():
        a, _ = on(ids)
        b, _ = off(ids)
    inside = c.sinks + c.window  # the first query that can read an evicted token is at S + W
    assert torch.equal(a[:, :inside], b[:, :inside])
    assert (a[:, inside:] - b[:, inside:]).abs().max() > 100 * TOL


@pytest.mark.parametrize("kw", [p.values[0] for p in NOVELTY[:1] + GRID[1:2]], ids=["novelty", "attention"])
def test_the_read_distance_moves_the_logits_only_past_s_plus_w_and_keeps_the_memory(kw):
    """`memory_distance` changes where the window reads its memory, not what it holds: the
    same logits within S + W, different ones past it; for "novelty" (scored without the
    query) the same slots, and the state's architecture is the same, so a saved state moves
    between the two."""
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(4))
    near = window_model(**kw)
    c = near.config
    far = window_model(**{**kw, "memory_distance": 3 * c.window})
    assert far.config.memory_read_at == 3 * c.window and c.memory_read_at == c.window
    assert far.config.architecture() == c.architecture()
    with torch.no_grad():
        a, sa = near(ids)
        b, sb = far(ids)
    inside = c.sinks + c.window
    assert torch.equal(a[:, :inside], b[:, :inside])
    assert (a[:, inside:] - b[:, inside:]).abs().max() > TOL  # the same arithmetic but one angle: any change is the angle's
    if c.memory_policy == "novelty":
        assert torch.equal(sa.tensors["mem_pos"], sb.tensors["mem_pos"])


def test_a_negative_read_distance_is_refused_and_zero_is_left_out_of_the_config():
    for bad in (-1, "far", 2.5, True):  # a config.json edited by hand: one line, not a TypeError
        with pytest.raises(ValueError, match="memory_distance is the RoPE distance"):
            window_model(memory_slots=4, memory_policy="novelty", memory_distance=bad)
    c = window_model(memory_slots=4, memory_policy="novelty").config
    assert "memory_distance" not in c.to_dict()  # the shipped configs' bytes (and fingerprints) as before
    assert c.replace(memory_distance=512).to_dict()["memory_distance"] == 512


def test_each_group_reads_its_memory_at_its_own_distance():
    """`memory_rest_distance` moves the rest group's read only: layer 0 (the rest) reads at
    it, layer 1 at `memory_distance`; naming the same distance twice changes nothing, a
    different one changes the logits past S + W only, and the state's architecture and slots
    stay the same."""
    kw = dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=(1,), memory_rest_slots=2,
              memory_distance=3 * NW)
    ids = torch.randint(0, 64, (1, 45), generator=torch.Generator().manual_seed(23))
    both, same, apart = window_model(**kw), window_model(**kw, memory_rest_distance=3 * NW), window_model(**kw, memory_rest_distance=NW)
    assert [b.attn.memory_at for b in both.blocks] == [3 * NW, 3 * NW]
    assert [b.attn.memory_at for b in apart.blocks] == [NW, 3 * NW]
    assert apart.config.memory_read_at_layer(0) == NW and apart.config.memory_read_at_layer(1) == apart.config.memory_read_at == 3 * NW
    assert apart.config.architecture() == both.config.architecture()
    with torch.no_grad():
        a, sa = both(ids)
        b, _ = same(ids)
        c, sc = apart(ids)
    assert torch.equal(a, b)
    inside = NW + both.config.sinks
    assert torch.equal(a[:, :inside], c[:, :inside]) and (a[:, inside:] - c[:, inside:]).abs().max() > TOL
    assert torch.equal(sa.tensors["rest_pos"], sc.tensors["rest_pos"]) and torch.equal(sa.tensors["mem_pos"], sc.tensors["mem_pos"])


@pytest.mark.parametrize("kw", [dict(memory_rest_distance=40), dict(memory_rest_distance=-1, memory_layers=(1,), memory_rest_slots=2),
                                dict(memory_rest_distance="far", memory_layers=(1,), memory_rest_slots=2)])
def test_a_rest_read_distance_needs_a_rest_group_and_a_distance(kw):
    with pytest.raises(ValueError, match="memory_rest_distance"):
        window_model(memory_slots=4, memory_policy="novelty", **kw)
    assert "memory_rest_distance" not in window_model(memory_slots=4, memory_policy="novelty").config.to_dict()


@pytest.mark.parametrize("kw", GRID)
def test_pieces_save_load_then_decode_equals_one_pass_with_memory(kw):
    model = window_model(**kw)
    ids = torch.randint(0, 64, (1, 47), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, full_state = model(ids)
        state, outs, pos = None, [], 0
        for n in (2, 5, 1, 17, 9):
            logits, state = model(ids[:, pos : pos + n], state)
            outs.append(logits)
            pos += n
            blob = state.to_bytes(fingerprint="fp", architecture=model.config.architecture())
            state = RecurrentState.from_bytes(blob, config=model.config, fingerprint="fp")
        for t in range(pos, ids.shape[1]):
            logits, state = model(ids[:, t : t + 1], state)
            outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    assert state.names == full_state.names and "mem_k" in state.names
    assert torch.equal(state.tensors["mem_pos"], full_state.tensors["mem_pos"])
    for name in state.names:
        torch.testing.assert_close(state.tensors[name], full_state.tensors[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", GRID)
def test_lean_step_with_memory_equals_forward_token_by_token(kw):
    """Two rows at different positions, through several turnovers of the memory: step_ (in
    place) == forward at T = 1 == chunked prefill, in the logits and in every state tensor."""
    model = window_model(**kw)
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        _, a = model(torch.randint(0, 64, (1, 4), generator=gen))
        both = RecurrentState.stack([a, model.new_state(1)])
        ref, lean = both, both.clone()
        for _ in range(5 * model.config.window):
            tok = torch.randint(0, 64, (2,), generator=gen)
            want, ref = model(tok[:, None], ref)
            got = model.step_(tok, lean)
            torch.testing.assert_close(got, want[:, 0], rtol=1e-5, atol=1e-5)
    assert torch.equal(lean.tensors["mem_pos"], ref.tensors["mem_pos"])
    assert lean.allclose(ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["recall", "novelty"])
def test_decode_token_by_token_equals_chunked_prefill_with_memory(policy):
    model = window_model(memory_slots=4, memory_policy=policy, **wide(policy))
    ids = torch.randint(0, 64, (70,), generator=torch.Generator().manual_seed(6)).tolist()
    with torch.no_grad():
        last, chunked = EagerRunner(model, segment_len=16).prefill(ids)
        state = model.new_state(1)
        for t in ids:
            logits, state = model(torch.tensor([[t]]), state)
    torch.testing.assert_close(logits[:, -1], last, rtol=1e-5, atol=1e-5)
    assert torch.equal(state.tensors["mem_pos"], chunked.tensors["mem_pos"])
    for name in state.names:
        torch.testing.assert_close(state.tensors[name], chunked.tensors[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["attention", "novelty"])
def test_padded_and_batched_rows_with_memory_are_independent(policy):
    model = window_model(memory_slots=3, memory_policy=policy, **wide(policy))
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        _, prefix = model(ids[:, :20])
        _, short = model(ids[:1, 20:23], prefix.select(0))
        logits, padded = model(ids[:, 20:], prefix, lengths=torch.tensor([3, 20]), last_only=True)
        ref_logits, _ = model(ids[:1, 20:23], prefix.select(0))
        _, alone = model(ids[1:, 20:], prefix.select(1))
    for row, want in ((padded.select(0), short), (padded.select(1), alone)):
        for name in row.names:
            torch.testing.assert_close(row.tensors[name], want.tensors[name], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[0, 0], ref_logits[0, -1], rtol=1e-5, atol=1e-5)


def test_state_with_memory_is_fixed_size_and_positions_stay_bounded():
    """The state's bytes do not grow with the session; a state moved 10^6 windows on (memory
    positions too) decodes as the near one: the memory is read at distance W, never at its
    absolute position."""
    model = window_model(memory_slots=4, memory_policy="recall", combine="gated")
    c = model.config
    ids = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        _, short = model(ids[:, :10])
        _, state = model(ids)
        assert short.nbytes == state.nbytes == c.state_bytes()
        far = state.clone()
        shift = 10**6 * c.window
        far.tensors["pos"] = far.pos + shift
        mp = far.tensors["mem_pos"]
        far.tensors["mem_pos"] = torch.where(mp != EMPTY, mp + shift, mp)
        near_logits, _ = model(torch.tensor([[5, 6, 7]]), state)
        far_logits, _ = model(torch.tensor([[5, 6, 7]]), far)
    torch.testing.assert_close(far_logits, near_logits, rtol=1e-5, atol=1e-5)
    M, G, D, L = c.memory_slots, c.kv_heads, c.head_k_dim, c.n_layers
    assert c.state_bytes() - window_model(**{"memory_slots": 0, "combine": "gated"}).config.state_bytes() == L * G * M * (2 * D * 2 + 4 + 8)  # keys and values bf16


def test_recall_policy_needs_the_branch():
    with pytest.raises(ValueError, match="memory_policy 'recall'"):
        window_model(memory_slots=4, memory_policy="recall", gla_branch=False)


def test_novelty_policy_needs_no_branch_and_unknown_policies_are_refused():
    assert window_model(memory_slots=4, memory_policy="novelty", gla_branch=False).config.memory_policy == "novelty"
    with pytest.raises(ValueError, match="memory_policy must be one of recall, attention, novelty"):
        window_model(memory_slots=4, memory_policy="lru")


def periodic(T: int, period: int, unique_at: int, filler: tuple[int, ...] = (5, 6, 7), unique: int = 42) -> list[int]:
    """A filler of `period` tokens repeated, with one token said once at `unique_at`."""
    ids = [filler[i % period] for i in range(T)]
    ids[unique_at] = unique
    return ids


def test_novelty_scores_a_repeated_key_zero_and_a_key_said_once_high():
    """Keys of a period-3 filler and one key said once, as the window leaves them behind:
    every filler key has its twin among the W keys after it (score exactly 0, also when the
    twin went through rounding), the one-off key has none."""
    gen = torch.Generator().manual_seed(0)
    W, D, T = 6, 8, 30  # W >= 2 periods: the filler key the one-off one displaced has its next twin in the window too
    vocab = torch.randn(4, D, generator=gen)
    ids = periodic(T, 3, 11, filler=(0, 1, 2), unique=3)
    keys = vocab[ids] * torch.linspace(0.5, 2.0, T)[:, None]  # the norm does not matter, the direction does
    # A twin that went through rounding (the ring's rotation and back) is a twin: 1 - cos ~ 1e-6.
    keys[1::2] += 1e-3 * keys[1::2].norm(dim=-1, keepdim=True) * torch.randn(keys[1::2].shape, generator=gen) / D**0.5
    leaving = torch.arange(T - W)  # the token at p leaves with p + 1 .. p + W left in the window
    j = torch.arange(T)
    ok = (j[None, :] > leaving[:, None]) & (j[None, :] <= leaving[:, None] + W)
    score = novelty(keys[None, None, : T - W], keys[None, None], ok[None])[0, 0]
    assert score[11] > 0.1
    assert (score[torch.arange(T - W) != 11] == 0).all()
    # With the window that includes the leaving key itself (an off-by-one), it would be 0 too.
    self_ok = (j[None, :] >= leaving[:, None]) & (j[None, :] <= leaving[:, None] + W)
    assert novelty(keys[None, None, : T - W], keys[None, None], self_ok[None])[0, 0, 11] == 0


@pytest.mark.parametrize("split", [(60,), (1,) * 60, (9, 4, 30, 17)], ids=["one-pass", "token-by-token", "pieces"])
def test_novelty_memory_keeps_the_token_said_once_not_the_filler(split):
    """A period-3 filler with one token said once, M = 1: in layer 0 (where a key is a function
    of its token alone, so every filler key has an exact twin in the window) the memory holds
    the most recent filler until the one-off token leaves the window, then that token for
    good, whatever the filler that keeps leaving after it; however the stream is split."""
    model = window_model(memory_slots=1, memory_policy="novelty", gla_branch=False, window=NW)
    c = model.config
    unique_at = 12
    ids = torch.tensor([periodic(60, 3, unique_at)])
    leaves = unique_at + c.window  # the step at which it leaves
    state, pos, held = None, 0, {}
    with torch.no_grad():
        for n in split:
            _, state = model(ids[:, pos : pos + n], state)
            pos += n
            held[pos] = state.tensors["mem_pos"][0, 0].flatten().tolist()  # layer 0, row 0: [G * M]
    for end, slots in held.items():
        last = end - 1  # the last step read
        if last >= leaves:
            assert slots == [unique_at + 1] * c.kv_heads, (end, slots)
        elif last >= c.sinks + c.window:  # filler only has left: all 0, the latest wins the tie
            assert slots == [last - c.window + 1] * c.kv_heads, (end, slots)


@pytest.mark.parametrize("path", ["one-pass", "pieces", "lean-step"])
@pytest.mark.parametrize("gap", [1, NOVELTY_SPAN, NOVELTY_SPAN + 1])
def test_novelty_keeps_a_repeat_within_the_span_and_drops_a_far_one(gap, path):
    """A token said twice, `gap` tokens apart, in a period-2 filler, M = 2, layer 0 (a key is
    a function of its token alone: copies are exact twins). Within NOVELTY_SPAN the second copy
    is no twin of the first ("88020"): both copies score > 0 and the memory ends with both (it
    would hold only the second with the filler beside it, were the near copy a twin). At
    NOVELTY_SPAN + 1 the second copy is in the window past the span when the first leaves: the
    first scores 0 as the filler does, and the memory ends with the second and the latest
    filler. Prefill, prefill in pieces and the lean decode step agree."""
    model = window_model(memory_slots=2, memory_policy="novelty", gla_branch=False, window=NW)
    c = model.config
    u = 12  # the first copy; the filler's twins past the span are 2 apart, so two copies never hide both
    T = u + NOVELTY_SPAN + 1 + NW + 7  # the second copy has left the window too, whatever the gap
    ids = periodic(T, 2, u, filler=(5, 6), unique=42)
    ids[u + gap] = 42
    ids = torch.tensor([ids])
    with torch.no_grad():
        if path == "lean-step":
            state = model.new_state(1)
            for t in range(T):
                model.step_(ids[:, t], state)
        else:
            state, pos = None, 0
            for n in ((T,) if path == "one-pass" else (5, 17, 1, 9, T - 32)):
                _, state = model(ids[:, pos : pos + n], state)
                pos += n
    held = state.tensors["mem_pos"][0, 0].flatten().tolist()  # layer 0, row 0: [G * M], 1 + position
    want = [u + 1, u + gap + 1] if gap <= NOVELTY_SPAN else [u + gap + 1, T - c.window]  # T - 1 - W left last
    assert held == want * c.kv_heads, (gap, path, held)


def test_a_memory_in_some_layers_stacks_over_those_layers_only():
    """memory_layers=(1,): the memory's tensors have one layer row (the state is that much
    smaller), layer 1's layer view holds them and layer 0's does not, and they fill."""
    kw = dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW)
    some, every = window_model(**kw, memory_layers=(1,)), window_model(**kw)
    c = some.config
    ids = torch.randint(0, 64, (1, 45), generator=torch.Generator().manual_seed(21))
    with torch.no_grad():
        _, state = some(ids)
    assert state.tensors["mem_k"].shape == (1, 1, c.kv_heads, 4, c.head_k_dim)
    assert state.tensors["mem_k"].dtype == torch.bfloat16 and state.tensors["mem_score"].dtype == torch.float32
    assert state.tensors["win_k"].shape[0] == c.n_layers == 2
    assert (state.tensors["mem_pos"] != EMPTY).all()
    views = state.layer_views(c)
    assert "mem_k" not in views[0] and views[1]["mem_k"].data_ptr() == state.tensors["mem_k"].data_ptr()
    per_layer = every.config.state_bytes() - window_model(**{**kw, "memory_slots": 0}).config.state_bytes()
    assert every.config.state_bytes() - c.state_bytes() == per_layer // 2
    assert "layers1" in c.architecture() and c.architecture() != every.config.architecture()


def test_a_rest_group_keeps_its_own_slot_count_in_the_other_layers():
    """memory_layers=(1,), memory_rest_slots=2: layer 1 reads 4 slots of mem_k & co., layer 0
    2 slots of rest_k & co. under the same names; both fill, and the state is their bytes."""
    kw = dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=(1,))
    model, alone = window_model(**kw, memory_rest_slots=2), window_model(**kw)
    c = model.config
    ids = torch.randint(0, 64, (1, 45), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        _, state = model(ids)
    assert state.tensors["mem_k"].shape == (1, 1, c.kv_heads, 4, c.head_k_dim)
    assert state.tensors["rest_k"].shape == (1, 1, c.kv_heads, 2, c.head_k_dim) and state.tensors["rest_k"].dtype == torch.bfloat16
    assert (state.tensors["rest_pos"] != EMPTY).all() and (state.tensors["mem_pos"] != EMPTY).all()
    views = state.layer_views(c)
    assert views[0]["mem_k"].data_ptr() == state.tensors["rest_k"].data_ptr()
    assert views[1]["mem_k"].data_ptr() == state.tensors["mem_k"].data_ptr()
    per_slot = (alone.config.state_bytes() - window_model(**{**kw, "memory_slots": 3}).config.state_bytes())
    assert c.state_bytes() - alone.config.state_bytes() == 2 * per_slot  # 2 slots in one layer, as 1 of 4 in one
    assert c.architecture().endswith("-rest2") and c.architecture() != alone.config.architecture()


@pytest.mark.parametrize("kw", [dict(memory_rest_slots=2), dict(memory_rest_slots=2, memory_slots=0, memory_layers=(1,)),
                                dict(memory_rest_slots=-1, memory_layers=(1,))])
def test_rest_slots_need_a_memory_in_chosen_layers(kw):
    with pytest.raises(ValueError, match="memory_rest_slots"):
        window_model(**{**dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW), **kw})


@pytest.mark.parametrize("layers", [(2,), (1, 0), (0, 0), (-1,)])
def test_memory_layers_must_be_distinct_ascending_layer_indices(layers):
    with pytest.raises(ValueError, match="memory_layers"):
        window_model(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW, memory_layers=layers)


def test_memory_keys_and_values_are_kept_in_bf16_as_every_path_reads_them():
    """The memory stores bf16: a one-pass prefill, token-by-token decode and the float64
    reference all read the rounded keys (so they agree), and its stored values are exactly
    bf16-representable."""
    model = window_model(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NW)
    ids = torch.randint(0, 64, (1, 45), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        _, state = model(ids)
    mk = state.tensors["mem_k"]
    assert mk.dtype == torch.bfloat16
    blob = state.to_bytes(fingerprint="fp", architecture=model.config.architecture())
    back = RecurrentState.from_bytes(blob, config=model.config, fingerprint="fp")
    assert back.tensors["mem_k"].dtype == torch.bfloat16 and torch.equal(back.tensors["mem_k"], mk)
    assert len(blob) < model.config.state_bytes() + 4096  # bf16 on disk too, not widened to fp32
