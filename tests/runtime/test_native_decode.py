"""The C decode step (`native/decode.py` + `decode.c`) against the torch step and forward:
token by token, in the logits and every state tensor, for fp32 and int8 weights; and the
cases it must hand back to the torch step (a hook, a replaced weight, two rows)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from agent.runtime import native
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime import window_decode
from agent.runtime.layers import GLU, fuse_linears_
from agent.runtime.memory import EMPTY, NOVELTY_SPAN
from agent.runtime.native import decode as native_decode
from agent.runtime.quant import quantize_int8_
from agent.runtime.state import RecurrentState
from agent.runtime.state_spec import memory_slots_of
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from tests.runtime.test_window import GRID, window_model


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    """The kernels built fresh into a temporary cache; `kernels(False)` turns them off."""
    monkeypatch.setenv("LAPLACE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.delenv("LAPLACE_NATIVE", raising=False)
    native.reset()
    if native.library() is None:
        native.reset()
        pytest.skip(native.status())

    def switch(on: bool) -> None:
        monkeypatch.setenv("LAPLACE_NATIVE", "1" if on else "0")
        native.reset()

    yield switch
    native.reset()


def decode_model(int8: bool, **kw) -> nn.Module:
    """A random window model in the decode layout a load gives (q/k/v and gate/up fused)."""
    model = window_model(**kw)
    for block in model.blocks:
        assert fuse_linears_(block.attn, block.attn.FUSED) and fuse_linears_(block.ffn, GLU.FUSED)
    return quantize_int8_(model) if int8 else model


def run_both(model, kernels, n: int, *, seed: int = 5) -> tuple[list, list, RecurrentState, RecurrentState]:
    """n tokens stepped with the kernels and without, from two empty states."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        on, off = model.new_state(1), model.new_state(1)
        got, want = [], []
        for _ in range(n):
            tok = torch.randint(0, model.config.vocab_size, (1,), generator=gen)
            kernels(True)
            got.append(model.step_(tok, on))
            kernels(False)
            want.append(model.step_(tok, off))
    return got, want, on, off


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kw", GRID)
def test_c_step_equals_the_torch_step(kw, int8, kernels):
    """Through the sinks, the first window, its wrap and a second epoch. int8: the same
    bf16 roundings in the same places (the kernels' exp is within 2 ulp of torch's, so a
    rounding can differ), so the logits agree closely."""
    model = decode_model(int8, **kw)
    kernels(True)
    with torch.no_grad():
        assert native_decode.plan_for(model, model.new_state(1)) is not None
    n = 3 * model.config.window + model.config.sinks + 2
    got, want, on, off = run_both(model, kernels, n)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4 if int8 else 1e-5, atol=1e-4 if int8 else 1e-5)
    assert on.allclose(off, rtol=1e-5, atol=1e-5) and on.pos.tolist() == off.pos.tolist() == [[n]]


@pytest.mark.parametrize("kw", GRID[:2])
def test_c_step_equals_the_torch_forward(kw, kernels):
    model = decode_model(False, **kw)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        ref, state = model.new_state(1), model.new_state(1)
        for _ in range(2 * model.config.window + 3):
            tok = torch.randint(0, 64, (1,), generator=gen)
            kernels(False)
            want, ref = model(tok[:, None], ref)
            kernels(True)
            torch.testing.assert_close(model.step_(tok, state), want[:, 0], rtol=1e-5, atol=1e-5)
    assert state.allclose(ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kw", GRID)
def test_c_prefill_equals_the_torch_forward(kw, int8, kernels):
    """A prefill in pieces of 5, 1, 17 and 9 tokens (across the sinks, the window's wrap and
    a second epoch), every logit and the state, against the torch forward's blocks; the
    state handed in is left as it was."""
    model = decode_model(int8, **kw)
    ids = torch.randint(0, 64, (1, 32), generator=torch.Generator().manual_seed(7))
    tol = dict(rtol=1e-4, atol=1e-4) if int8 else dict(rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        on, off = model.new_state(1), model.new_state(1)
        start = 0
        for n in (5, 1, 17, 9):
            piece = ids[:, start : start + n]
            start += n
            kernels(False)
            want, off = model(piece, off)
            kernels(True)
            before = on.clone()
            got, new = model(piece, on)
            assert on.allclose(before, rtol=0, atol=0)  # not modified in place
            on = new
            torch.testing.assert_close(got, want, **tol)
            last, _ = model(piece, before, last_only=True)
            # int8: the head of one row takes the decode row's matmul (bf16 activations), of
            # many the GEMM path (bf16 or fp32, as the CPU measures), so they agree to bf16's rounding.
            torch.testing.assert_close(last, got[:, -1:], **(dict(rtol=2e-2, atol=2e-3) if int8 else dict(rtol=1e-6, atol=1e-6)))
    assert on.allclose(off, **tol) and on.pos.tolist() == off.pos.tolist() == [[32]]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_a_loaded_model_takes_the_c_step(int8, kernels, tmp_path):
    """A decode-layout load (fused rows, the column-major head or the int8 head) qualifies."""
    src = window_model(combine="softmax", vocab_size=264)
    d = save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})
    model = load_model_dir(d, quant="int8" if int8 else None, decode_layout=True).model
    with torch.inference_mode():
        assert native_decode.plan_for(model, model.new_state(1)) is not None
    got, want, on, off = run_both(model, kernels, 12)
    torch.testing.assert_close(torch.cat(got), torch.cat(want), rtol=1e-5, atol=1e-5)


def test_a_hook_or_a_replaced_weight_sends_the_step_back_to_torch(kernels):
    model = decode_model(True)
    kernels(True)
    state = model.new_state(1)
    with torch.no_grad():
        assert native_decode.plan_for(model, state) is not None
        seen = []
        handle = model.blocks[1].ffn.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        assert native_decode.plan_for(model, state) is None
        model.step_(torch.tensor([3]), state)
        assert seen == [torch.Size([1, 32])]  # the torch step ran, so the hook saw the GLU
        handle.remove()
        assert native_decode.plan_for(model, state) is not None
        model.blocks[0].attn.o_proj = nn.Linear(32, 32, bias=False)  # an fp32 Linear in an int8 model
        assert native_decode.plan_for(model, state) is None
        assert native_decode.plan_for(model, RecurrentState.stack([state, state])) is None  # two rows


def test_with_the_kernels_off_or_gradients_on_the_torch_step_runs(kernels):
    model = decode_model(False)
    assert native_decode.plan_for(model, model.new_state(1)) is None  # gradients on: a trainer's step
    kernels(False)
    with torch.no_grad():
        assert native_decode.plan_for(model, model.new_state(1)) is None
    assert native.status() == "off (LAPLACE_NATIVE=0)"


def test_a_replaced_projection_is_read_by_the_next_c_step(kernels):
    """The plan is rebuilt when a module it read is replaced: the new weights are used."""
    model = decode_model(False)
    got, want, _, _ = run_both(model, kernels, 3)
    new = nn.Linear(32, 32, bias=False)
    torch.nn.init.normal_(new.weight, std=0.5)
    model.blocks[1].attn.o_proj = new
    after, after_ref, on, off = run_both(model, kernels, 3)
    for g, w, g0 in zip(after, after_ref, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(g, g0, rtol=1e-3, atol=1e-3)  # the new o_proj is really in the step


@pytest.mark.parametrize("kw", GRID)
def test_the_layer_c_step_equals_the_torch_step_and_forward(kw, kernels):
    """A model not in the decode layout (q/k/v apart) takes the C kernel layer by layer
    (`window_decode._native_step`): through the sinks, the first window, its wrap and a
    second epoch, forward's logits and state, and the torch step's, token by token."""
    model = window_model(**kw)
    gen = torch.Generator().manual_seed(21)
    with torch.no_grad():
        ref, c_state, torch_state = model.new_state(1), model.new_state(1), model.new_state(1)
        for _ in range(3 * model.config.window + model.config.sinks + 2):
            tok = torch.randint(0, 64, (1,), generator=gen)
            kernels(False)
            want, ref = model(tok[:, None], ref)
            plain = model.step_(tok, torch_state)
            kernels(True)
            got = model.step_(tok, c_state)
            torch.testing.assert_close(got, want[:, 0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    assert c_state.allclose(ref, rtol=1e-5, atol=1e-5) and c_state.allclose(torch_state, rtol=1e-5, atol=1e-5)
    assert native.status().startswith("on")


# A "novelty" memory: the window wider than the span, so twins count and slots turn over. The
# vocabulary is the engine tests' (264): with 64 ids, layer 0 (whose keys are the token's
# alone) sees one id leave twice against the same window key, read back from two ring angles,
# and two scores equal up to rounding rank by the rounding, which the C and torch sums make
# differently; the logits still agree.
MEMORY = [
    pytest.param(dict(memory_slots=3, memory_policy="novelty", combine="softmax", window=NOVELTY_SPAN + 4, vocab_size=264),
                 id="branch"),
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NOVELTY_SPAN + 4, vocab_size=264),
                 id="window-only"),
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NOVELTY_SPAN + 4, vocab_size=264,
                      memory_layers=(1,)), id="layer-1-only"),
    pytest.param(dict(memory_slots=4, memory_policy="novelty", gla_branch=False, window=NOVELTY_SPAN + 4, vocab_size=264,
                      memory_layers=(1,), memory_rest_slots=2), id="layer-1-rest-2"),
]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kw", MEMORY)
def test_c_step_with_a_memory_equals_the_torch_step(kw, int8, kernels):
    """A "novelty" memory takes the C step too (`laplace_window_memory`): through six windows,
    so the memory fills and turns over, the same logits and state (the same tokens held) as
    the torch step, whose ranking sorts the candidates every step."""
    model = decode_model(int8, **kw)
    kernels(True)
    with torch.no_grad():
        assert native_decode.plan_for(model, model.new_state(1)) is not None
    c = model.config
    got, want, on, off = run_both(model, kernels, c.sinks + 6 * c.window + 3)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4 if int8 else 1e-5, atol=1e-4 if int8 else 1e-5)
    held = on.tensors["mem_pos"]
    assert torch.equal(held, off.tensors["mem_pos"]) and bool((held != EMPTY).all())
    assert on.allclose(off, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", MEMORY)
def test_rows_with_a_memory_step_through_the_c_kernel_one_by_one(kw, kernels, monkeypatch):
    """Two rows at different lengths stepped together (as the server steps a batch): each
    row's own C call (`window_decode._native_step`), the same as the batched torch step."""
    model = window_model(**kw)
    calls = []
    real = window_decode.run_window
    monkeypatch.setattr(window_decode, "run_window", lambda *a: calls.append(a[3]) or real(*a))
    gen = torch.Generator().manual_seed(8)
    c = model.config
    with torch.no_grad():
        kernels(False)
        _, first = model(torch.randint(0, 264, (1, c.window + 5), generator=gen), model.new_state(1))  # row 0 is further on
        on = RecurrentState.stack([first, model.new_state(1)])
        off = on.clone()
        for _ in range(3 * c.window):
            tok = torch.randint(0, 264, (2,), generator=gen)
            kernels(False)
            want = model.step_(tok, off)
            kernels(True)
            torch.testing.assert_close(model.step_(tok, on), want, rtol=1e-5, atol=1e-5)
    # per row, at its position, in the layers with a memory (one without takes the batched torch step)
    with_memory = sum(1 for i in range(c.n_layers) if memory_slots_of(c, i))
    assert len(calls) == 3 * c.window * 2 * with_memory and calls[:2] == [c.window + 5, 0]
    assert torch.equal(on.tensors["mem_pos"], off.tensors["mem_pos"]) and on.allclose(off, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["attention", "recall"])
def test_a_memory_the_kernel_does_not_score_takes_the_torch_step(policy, kernels):
    model = decode_model(False, memory_slots=3, memory_policy=policy, combine="softmax")
    kernels(True)
    with torch.no_grad():
        assert native_decode.plan_for(model, model.new_state(1)) is None


def test_the_layer_c_step_is_not_taken_with_a_probe_hooked_on_the_decays(kernels):
    """A hook on decay_tap sees every step's decays: the torch step runs so it fires."""
    model = window_model()
    seen = []
    model.blocks[0].attn.decay_tap.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        state = model.new_state(1)
        for t in range(3):
            model.step_(torch.tensor([t]), state)
    assert seen == [torch.Size([1, 1, 4])] * 3


def test_without_a_compiler_the_torch_step_runs_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("LAPLACE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    native.reset()
    try:
        model = window_model()
        with torch.no_grad():
            _, ref = model(torch.tensor([[1, 2]]))
            state = model.new_state(1)
            model.step_(torch.tensor([1]), state)
            got = model.step_(torch.tensor([2]), state)
        assert "no C compiler" in native.status()
        assert state.allclose(ref, rtol=1e-5, atol=1e-5) and got.shape == (1, 64)
    finally:
        native.reset()


def test_a_library_others_can_write_is_not_loaded(monkeypatch, tmp_path):
    """The kernels are code: from a cache directory another user can write, they are refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("LAPLACE_NATIVE_CACHE", str(shared))
    monkeypatch.delenv("LAPLACE_NATIVE", raising=False)
    native.reset()
    try:
        if native.library() is None:
            pytest.skip(native.status())
        shared.chmod(0o777)
        native.reset()
        assert native.library() is None and "not private" in native.status()
        shared.chmod(0o700)
        native.reset()
        assert native.library() is not None
    finally:
        native.reset()


def test_a_damaged_library_is_built_again_not_loaded(monkeypatch, tmp_path):
    """A truncated library crashed dlopen with SIGBUS; its sha256 no longer matches, so the
    next process rebuilds it (in a child here, so a crash would fail the test, not end it)."""
    env = {**os.environ, "LAPLACE_NATIVE_CACHE": str(tmp_path), "LAPLACE_NATIVE": "1"}
    probe = [sys.executable, "-c", "from agent.runtime import native; print(native.status())"]
    first = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=300)
    if not first.stdout.startswith("on"):
        pytest.skip(first.stdout.strip())
    (lib,) = tmp_path.glob("*.so")
    lib.write_bytes(lib.read_bytes()[:1000])
    again = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.startswith("on"), (again.returncode, again.stdout, again.stderr)
    assert len(lib.read_bytes()) > 1000
