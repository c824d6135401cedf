"""The torch-free engine (`native/engine.py`) against the torch runtime on saved model
directories: its prefill and step give the torch forward's and step's logits and state, for
fp32 and int8 weights, through the sinks, the window's wrap and a second epoch; the
directories and models it cannot run say why; and importing and running it never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from agent.runtime import native
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.native.engine import INT8_CACHE, Engine, EngineUnavailable, step_tables
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from agent.runtime.window_decode import GATED_EPS
from agent.runtime.window_decode import step_tables as torch_step_tables
from tests.runtime.test_window import GRID, window_model


@pytest.fixture
def kernels(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("LAPLACE_NATIVE_CACHE", str(tmp_path_factory.mktemp("native")))
    monkeypatch.delenv("LAPLACE_NATIVE", raising=False)
    native.reset()
    if native.library() is None:
        native.reset()
        pytest.skip(native.status())
    yield
    native.reset()


def saved(tmp_path, int8: bool, **kw):
    """A random window model saved as a directory, and the torch runtime's load of it (an
    int8 load writes the int8 cache the engine reads)."""
    src = window_model(vocab_size=264, **kw)
    d = save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})
    return d, load_model_dir(d, quant="int8" if int8 else None, decode_layout=True).model


def ids(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 264, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_state_close(engine_state, torch_state, tol: float) -> None:
    assert engine_state.positions == torch_state.n_tokens
    for name, t in torch_state.layer_tensors.items():
        np.testing.assert_allclose(engine_state.tensors[name], t.numpy(), rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kw", GRID)
def test_prefill_then_steps_equal_the_torch_runtime(kw, int8, kernels, tmp_path):
    """A prefill across the sinks and the window (in two pieces: the second starts mid-ring),
    then steps through the wrap and into a second epoch. fp32 within 1e-4; int8 within the
    bf16 roundings the torch path makes and the engine does not (~2^-8 of a logit)."""
    d, model = saved(tmp_path, int8, **kw)
    engine = Engine.load(d, weights="int8" if int8 else "fp32")
    c = model.config
    tol = 3e-2 if int8 else 1e-4
    seq = ids(3 * c.window + c.sinks + 4)
    split = c.sinks + c.window // 2 + 1
    state = engine.new_state()
    engine.prefill(seq[:split], state)
    got = engine.prefill(seq[split : 2 * split], state)
    with torch.inference_mode():
        want, ts = model(torch.tensor([seq[: 2 * split]]))
        np.testing.assert_allclose(got, want[0, -1].numpy(), rtol=tol, atol=tol)
        assert_state_close(state, ts, tol)
        for tok in seq[2 * split :]:
            got = engine.step(tok, state)
            want = model.step_(torch.tensor([tok]), ts)
            np.testing.assert_allclose(got, want[0].numpy(), rtol=tol, atol=tol)
    assert_state_close(state, ts, tol)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_a_prefill_equals_the_same_tokens_stepped(int8, kernels, tmp_path):
    """Prefill and step are one computation: their logits and state agree closely (the
    prefill's matmuls sum in another order)."""
    d, _ = saved(tmp_path, int8, combine="softmax")
    engine = Engine.load(d, weights="int8" if int8 else "fp32")
    seq = ids(40)
    a, b = engine.new_state(), engine.new_state()
    got = engine.prefill(seq, a)
    for tok in seq:
        want = engine.step(tok, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for name in a.tensors:
        np.testing.assert_allclose(a.tensors[name], b.tensors[name], rtol=1e-4, atol=1e-4)
    assert a.positions == b.positions == 40


@pytest.mark.parametrize("T, N, K, threads", [(1, 13, 37, 1), (3, 13, 37, 2), (1, 230, 300, 2), (2, 230, 301, 2),
                                              (1, 1031, 576, 2)])
def test_the_int8_matmul_kernel_against_numpy(T, N, K, threads, kernels):
    """Rows not a multiple of 4, widths not a multiple of 16 or 32, several rows, and the
    split between the caller and the helper thread (from 64 K weights on), repeated so the
    helper is reused; against float64."""
    lib = native.library()
    rng = np.random.default_rng(T * N + K)
    w = rng.integers(-127, 128, (N, K), dtype=np.int8)
    scale = rng.random(N, dtype=np.float32) / 64
    for rep in range(3):
        x = rng.standard_normal((T, K), dtype=np.float32)
        out = np.full((T, N + 3), np.nan, np.float32)  # a row stride wider than N: columns N.. untouched
        lib.laplace_matmul_i8(x.ctypes.data, T, K, w.ctypes.data, scale.ctypes.data, N, out.ctypes.data, N + 3, threads)
        want = (x.astype(np.float64) @ w.T.astype(np.float64)) * scale
        # With VNNI each row of x is rounded to int16 (error at most 2^-16 of its largest
        # element): the sums agree to ~1e-4 of the largest output.
        np.testing.assert_allclose(out[:, :N], want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
        assert np.isnan(out[:, N:]).all()


def test_a_forked_child_gets_its_own_helper_thread(kernels):
    """The helper thread does not survive fork: a child that splits a matmul must not wait
    on it forever (the library starts a new one there)."""
    lib = native.library()
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (512, 256), dtype=np.int8)
    scale = np.ones(512, np.float32)
    x = rng.standard_normal((1, 256), dtype=np.float32)
    out = np.empty((1, 512), np.float32)
    lib.laplace_matmul_i8(x.ctypes.data, 1, 256, w.ctypes.data, scale.ctypes.data, 512, out.ctypes.data, 512, 2)
    want = out.copy()
    pid = os.fork()
    if pid == 0:  # the child: the same call, then exit with whether it matched
        try:
            out[:] = 0
            lib.laplace_matmul_i8(x.ctypes.data, 1, 256, w.ctypes.data, scale.ctypes.data, 512, out.ctypes.data, 512, 2)
            os._exit(0 if np.array_equal(out, want) else 1)
        finally:
            os._exit(2)
    deadline = 50
    import time

    while deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
        deadline -= 1
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the matmul's helper thread")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_long_prefill_runs_in_chunks(kernels, tmp_path, monkeypatch):
    """Prompts longer than a pass are read a chunk at a time with the same result."""
    import agent.runtime.native.engine as eng

    d, _ = saved(tmp_path, False, combine="gated")
    engine = Engine.load(d, weights="fp32")
    seq = ids(37)
    whole = engine.prefill(seq, s1 := engine.new_state())
    monkeypatch.setitem(eng.PREFILL_CHUNK, "fp32", 8)
    chunked = engine.prefill(seq, s2 := engine.new_state())
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s2.tensors["gla"], s1.tensors["gla"], rtol=1e-5, atol=1e-5)


def test_the_tables_and_constants_are_the_torch_steps(kernels):
    want = torch_step_tables(3, 7, 8, 100.0, torch.device("cpu"))
    got = step_tables(3, 7, 8, 100.0)
    for g, w in zip(got, (want.cos3, want.sin3, want.row, want.bias)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    from agent.runtime.native import engine as eng

    assert eng.GATED_EPS == GATED_EPS


@pytest.mark.parametrize("kw", GRID)
def test_the_state_is_the_torch_states_tensors(kw, kernels, tmp_path):
    d, model = saved(tmp_path, False, **kw)
    spec = Engine.load(d, weights="fp32").state_spec()
    assert spec == {n: s for n, s in model.config.state_spec(1).items() if n != "pos"}


def test_what_the_engine_cannot_run_says_why(kernels, tmp_path):
    d, _ = saved(tmp_path, False, combine="softmax")
    with pytest.raises(EngineUnavailable, match="no int8 cache"):
        Engine.load(d, weights="int8")  # only an int8 load writes the cache
    load_model_dir(d, quant="int8")
    Engine.load(d, weights="int8")
    os.utime(d / "model.safetensors")  # the weights file changed since: the cache is stale
    with pytest.raises(EngineUnavailable, match="another weights file"):
        Engine.load(d, weights="int8")
    (d / INT8_CACHE).write_bytes(b"\x10\x00")
    with pytest.raises(EngineUnavailable, match="too short"):
        Engine.load(d, weights="int8")
    (d / INT8_CACHE).write_bytes((10).to_bytes(8, "little") + b'{"a": 1}  ')
    with pytest.raises(EngineUnavailable, match="header is not readable"):
        Engine.load(d, weights="int8")
    mem, _ = saved(tmp_path / "m", False, combine="softmax", memory_slots=4, memory_policy="attention")
    with pytest.raises(EngineUnavailable, match="memory_policy is 'attention'"):  # "novelty" runs: test_native_memory.py
        Engine.load(mem, weights="fp32")
    with pytest.raises(EngineUnavailable, match="config.json"):
        Engine.load(tmp_path / "nowhere", weights="fp32")
    engine = Engine.load(d, weights="fp32")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.step(264, engine.new_state())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.prefill([1, -1], engine.new_state())


def test_a_truncated_weights_file_is_refused(kernels, tmp_path):
    d, _ = saved(tmp_path, False, combine="softmax")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(EngineUnavailable, match="truncated"):
        Engine.load(d, weights="fp32")


def test_the_engine_never_imports_torch(kernels, tmp_path):
    """The point of it: a process that loads and runs it holds no torch."""
    d, _ = saved(tmp_path, True, combine="softmax")
    code = ("import sys; from agent.runtime.native.engine import Engine; e = Engine.load(sys.argv[1]); "
            "s = e.new_state(); l = e.prefill([1, 2, 3], s); l = e.step(int(l.argmax()), s); "
            "print(s.positions, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=120,
                         env={**os.environ}, cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "False"]
