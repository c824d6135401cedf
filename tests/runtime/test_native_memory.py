"""The torch-free engine's memory of evicted tokens (`native/engine.py`, `laplace_window_memory`
in `native/decode.c`) against the torch runtime (`memory.py`, `window.py`, `window_decode.py`):
steps past the window, so the memory fills and its slots turn over; a prefill in chunks, in one
pass and token by token; the state crossing between the runtimes as stored bytes; and the
policies the kernel does not score ("recall", "attention") left to torch with the reason."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
import torch

import agent.runtime.native.engine as eng
from agent.runtime import memory, native
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.generation import EagerRunner
from agent.runtime.native.engine import Engine, EngineUnavailable, memory_table
from agent.runtime.native.runner import EngineRunner, open_engine_model
from agent.runtime.state import RecurrentState
from agent.runtime.window_decode import step_tables as torch_step_tables
from tests.runtime.test_native_engine import ids, kernels, saved  # noqa: F401  (kernels: the fixture)
from tests.runtime.test_window import window_config

NW = memory.NOVELTY_SPAN + 4  # a window with keys past the span after a leaving token, so twins can count
NOVELTY = dict(memory_policy="novelty")
GRID = [
    pytest.param(dict(memory_slots=4, gla_branch=False, window=NW), id="window-only"),
    # one kv group: a prefill's two threads share it (each reads its own copy of the ring and memory)
    pytest.param(dict(memory_slots=3, combine="gated", n_kv_heads=1, window=NW), id="gated-mqa"),
    pytest.param(dict(memory_slots=3, combine="softmax", head_k_dim=64, head_v_dim=64, window=NW), id="softmax-d64"),
    # W <= NOVELTY_SPAN: no key counts, every token scores 2 - TWIN: ties, which go to the later token
    pytest.param(dict(memory_slots=3, combine="softmax", sinks=0), id="short-window-ties"),
    # a memory in layer 1 only: layer 0 runs laplace_window, layer 1 its row of the memory
    pytest.param(dict(memory_slots=4, gla_branch=False, window=NW, memory_layers=(1,)), id="layer-1-only"),
    # and layer 0 a memory of its own size (`memory_rest_slots`): the kernel takes each layer's M
    pytest.param(dict(memory_slots=4, gla_branch=False, window=NW, memory_layers=(1,), memory_rest_slots=2), id="layer-1-rest-2"),
    # the memory read at its own distance (`memory_distance`), not W
    pytest.param(dict(memory_slots=4, gla_branch=False, window=NW, memory_distance=3 * NW), id="read-far"),
    # and each group at its own (`memory_rest_distance`): the engine passes each layer its group's table
    pytest.param(dict(memory_slots=4, gla_branch=False, window=NW, memory_layers=(1,), memory_rest_slots=2, memory_distance=3 * NW,
                      memory_rest_distance=NW + 5), id="groups-read-apart"),
]
WEIGHTS = pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])


def tolerance(int8: bool) -> float:
    """test_native_engine's: fp32 1e-4; int8 the bf16 roundings torch makes and the engine does not."""
    return 3e-2 if int8 else 1e-4


def assert_same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray], tol: float) -> None:
    """Two states' tensors: the memory's slots hold the same tokens, the rest within tol."""
    assert a.keys() == b.keys()
    np.testing.assert_array_equal(a["mem_pos"], b["mem_pos"])
    for name in a:
        if a[name].dtype == np.uint16:  # bf16 bits: the same key may round one bf16 step apart (2^-8)
            wide = [(x.astype(np.uint32) << 16).view(np.float32) for x in (a[name], b[name])]
            np.testing.assert_allclose(*wide, rtol=2**-7, atol=tol, err_msg=name)
        else:
            np.testing.assert_allclose(a[name], b[name], rtol=tol, atol=tol, err_msg=name)


@contextlib.contextmanager
def torch_math():
    """The torch runtime's own math inside: its step and prefill would take the same C kernel
    as the engine (`window_decode.run_window`), so the reference turns the kernels off for
    torch (an engine already loaded keeps its library)."""
    was = os.environ.get("LAPLACE_NATIVE")
    os.environ["LAPLACE_NATIVE"] = "0"
    native.reset()
    try:
        yield
    finally:
        os.environ.pop("LAPLACE_NATIVE") if was is None else os.environ.__setitem__("LAPLACE_NATIVE", was)
        native.reset()


def torch_tensors(state: RecurrentState) -> dict[str, np.ndarray]:
    """The state as the engine holds it: numpy, bf16 as its uint16 bits (`engine.np_dtype`)."""
    return {n: t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            for n, t in state.layer_tensors.items()}


@WEIGHTS
@pytest.mark.parametrize("kw", GRID)
def test_steps_past_the_window_equal_the_torch_steps(kw, int8, kernels, tmp_path):  # noqa: F811
    """Token by token from an empty state through six windows: every step's logits, and the
    state (ring, branch, memory) at the end; the memory is full and has turned over."""
    d, model = saved(tmp_path, int8, **NOVELTY, **kw)
    engine = Engine.load(d, weights="int8" if int8 else "fp32")
    c, tol = model.config, tolerance(int8)
    state, ts = engine.new_state(), RecurrentState.zeros(c, 1)
    held: set[int] = set()  # the tokens layer 0's first group has held
    with torch.inference_mode():
        for tok in ids(c.sinks + 6 * c.window + 5):
            got = engine.step(tok, state)
            with torch_math():
                want = model.step_(torch.tensor([tok]), ts)
            np.testing.assert_allclose(got, want[0].numpy(), rtol=tol, atol=tol)
            held |= set(state.tensors["mem_pos"][0, 0, 0].tolist())
    assert state.positions == ts.n_tokens
    assert_same_state(state.tensors, torch_tensors(ts), tol)
    assert (state.tensors["mem_pos"] != memory.EMPTY).all()
    assert len(held - {memory.EMPTY}) > 2 * c.memory_slots  # slots were replaced, not only filled


@WEIGHTS
@pytest.mark.parametrize("kw", GRID)
def test_a_prefill_in_chunks_equals_one_pass_and_the_steps(kw, int8, kernels, tmp_path, monkeypatch):  # noqa: F811
    """One pass, chunks of 5 (the second call starting mid-ring) and token by token are one
    computation; the one pass equals the torch forward's logits and state."""
    d, model = saved(tmp_path, int8, **NOVELTY, **kw)
    weights = "int8" if int8 else "fp32"
    engine = Engine.load(d, weights=weights)
    c = model.config
    seq = ids(c.sinks + 5 * c.window + 3)
    whole = engine.prefill(seq, one := engine.new_state())
    monkeypatch.setitem(eng.PREFILL_CHUNK, weights, 5)
    split = c.sinks + c.window + c.window // 2
    engine.prefill(seq[:split], pieces := engine.new_state())
    chunked = engine.prefill(seq[split:], pieces)
    stepped = engine.new_state()
    for tok in seq:
        last = engine.step(tok, stepped)
    for logits, state in ((chunked, pieces), (last, stepped)):
        np.testing.assert_allclose(logits, whole, rtol=1e-4, atol=1e-4)
        assert_same_state(state.tensors, one.tensors, 1e-4)
        assert state.positions == len(seq)
    with torch.inference_mode(), torch_math():
        want, ts = model(torch.tensor([seq]))
    tol = tolerance(int8)
    np.testing.assert_allclose(whole, want[0, -1].numpy(), rtol=tol, atol=tol)
    assert_same_state(one.tensors, torch_tensors(ts), tol)


def test_a_session_state_moves_between_the_engine_and_torch(kernels, tmp_path):  # noqa: F811
    """The runner's `ArrayState` as stored bytes: the engine's prefill, continued by torch
    (prefill and steps), continued by the engine: the same logits and state as torch alone,
    and the engine's blob is the bytes torch writes for the same state."""
    d, _ = saved(tmp_path, False, **NOVELTY, memory_slots=3, combine="softmax", window=NW)
    lm = load_model_dir(d, decode_layout=True)
    em = open_engine_model(d, weights="fp32")  # what the CLI's `engine_for` opens: the engine takes the model
    runner, eager = EngineRunner(em.engine, segment_len=16), EagerRunner(lm.model, segment_len=16)
    arch = em.config.architecture()
    seq = ids(6 * NW + 7)
    a, b, e = 2 * NW + 1, 3 * NW + 5, 4 * NW
    _, es = runner.prefill(seq[:a])
    blob = es.to_bytes(fingerprint=em.fingerprint, architecture=arch)
    ts = RecurrentState.from_bytes(blob, config=lm.config, fingerprint=lm.fingerprint)
    assert blob == ts.to_bytes(fingerprint=lm.fingerprint, architecture=arch)
    with torch.inference_mode(), torch_math():
        _, ts = eager.prefill(seq[a:b], ts)
        for tok in seq[b:e]:
            eager.step_token(tok, ts)
    es = runner.load_state(ts.to_bytes(fingerprint=lm.fingerprint, architecture=arch), config=em.config,
                           fingerprint=em.fingerprint)
    assert es.n_tokens == e
    for tok in seq[e:]:
        got = runner.step_token(tok, es)
    with torch.inference_mode(), torch_math():
        want, alone = eager.prefill(seq)
    np.testing.assert_allclose(got, want[0].numpy(), rtol=1e-4, atol=1e-4)
    assert_same_state(es.tensors, torch_tensors(alone), 1e-4)
    assert es.n_tokens == alone.n_tokens == len(seq)


@pytest.mark.parametrize("policy", ["recall", "attention"])
def test_the_other_memory_policies_are_left_to_torch(policy, kernels, tmp_path):  # noqa: F811
    """The kernel scores "novelty" only: the others are refused with a one-line reason naming
    the policy, by the engine and by the runner's opener (the CLI then loads torch)."""
    why = Engine.unsupported(window_config(memory_slots=4, memory_policy=policy, combine="softmax"))
    assert why is not None and f"memory_policy is '{policy}'" in why and "\n" not in why
    assert Engine.unsupported(window_config(memory_slots=4, memory_policy="novelty")) is None
    d, _ = saved(tmp_path, False, combine="softmax", memory_slots=4, memory_policy=policy)
    with pytest.raises(EngineUnavailable, match=f"memory_policy is '{policy}'"):
        Engine.load(d, weights="fp32")
    with pytest.raises(EngineUnavailable, match=f"memory_policy is '{policy}'"):
        open_engine_model(d, weights="fp32")


def test_the_constants_tables_and_state_are_the_torch_runtimes(kernels, tmp_path):  # noqa: F811
    assert (eng.NOVELTY_SPAN, eng.TWIN, eng.MEMORY_NAMES) == (memory.NOVELTY_SPAN, memory.TWIN, memory.MEMORY_NAMES)
    S, W, D = 3, 7, 8
    for at in (None, 3 * W):  # read at W, and at a distance of its own
        want = torch_step_tables(S, W, D, 100.0, torch.device("cpu"), at)
        got = memory_table(S, W, D, 100.0, at)
        for g, w in zip((got[0], got[1], got[2 : 2 + W], got[2 + W :]), (want.cos_mem, want.sin_mem, want.cos_ring, want.sin_ring)):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    assert not np.allclose(memory_table(S, W, D, 100.0)[:2], memory_table(S, W, D, 100.0, 3 * W)[:2])
    d, model = saved(tmp_path, False, **NOVELTY, memory_slots=3, combine="gated")
    spec = Engine.load(d, weights="fp32").state_spec()
    assert spec == {n: s for n, s in model.config.state_spec(1).items() if n != "pos"}
