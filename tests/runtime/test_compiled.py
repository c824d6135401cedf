"""The compiled path: same numbers as eager, and no recompilation once buckets are warm.

Graphs are counted with a counting backend that runs them eagerly, so these tests do not
pay for Inductor; the Inductor run itself is marked slow."""

from __future__ import annotations

import random

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from agent.runtime.compiled import CompiledRunner, default_segment_buckets
from agent.runtime.config import PRESETS
from agent.runtime.generation import EagerRunner
from agent.runtime.model import build_model


@pytest.fixture(scope="module")
def model():
    return build_model(PRESETS["tiny"], seed=0).eval()


def test_default_buckets_are_chunk_multiples():
    assert default_segment_buckets(128, 512) == (128, 256, 512)
    assert default_segment_buckets(16, 64) == (16, 32, 64)


def test_warm_buckets_never_recompile(model):
    torch._dynamo.reset()
    counter = CompileCounter()
    runner = CompiledRunner(model, backend=counter, segment_len=64, batch_widths=(1, 2, 4, 8))
    runner.warm_up()
    warmed = counter.frame_count
    assert warmed == len(runner.batch_widths) + len(runner.segment_buckets)
    rng = random.Random(0)
    with torch.inference_mode():
        for _ in range(12):
            n = rng.randint(1, 200)  # prefill of any length: segments padded to buckets
            runner.prefill([rng.randrange(200) for _ in range(n)])
            w = rng.randint(1, 8)  # decode at any batch width up to the largest
            runner.step(torch.randint(0, 200, (w,)), model.new_state(w))
    assert counter.frame_count == warmed


def test_compiled_matches_eager(model):
    torch._dynamo.reset()
    compiled = CompiledRunner(model, backend="eager", segment_len=64)
    eager = EagerRunner(model, segment_len=64)
    ids = torch.randint(0, 200, (150,)).tolist()
    with torch.inference_mode():
        l_c, s_c = compiled.prefill(ids)
        l_e, s_e = eager.prefill(ids)
        torch.testing.assert_close(l_c, l_e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s_c.gla, s_e.gla, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s_c.conv, s_e.conv)
        assert s_c.n_tokens == s_e.n_tokens == 150
        tok = torch.tensor([5, 7, 9])
        st = s_e.clone().padded_to(3)  # three rows
        lc, sc = compiled.step(tok, st)
        le, se = eager.step(tok, st)
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sc.gla, se.gla, rtol=1e-5, atol=1e-5)


def test_bucket_limits_are_enforced(model):
    with pytest.raises(ValueError, match="multiples of the chunk"):
        CompiledRunner(model, backend="eager", segment_len=64, segment_buckets=(10, 64))
    with pytest.raises(ValueError, match="at most 8"):
        CompiledRunner(model, backend="eager", segment_len=64, batch_widths=tuple(range(1, 10)))
    runner = CompiledRunner(model, backend="eager", segment_len=64, batch_widths=(1, 2))
    with pytest.raises(ValueError, match="largest compiled width"):
        runner.step(torch.zeros(3, dtype=torch.long), model.new_state(3))


@pytest.mark.slow
def test_inductor_matches_eager(model):
    torch._dynamo.reset()
    runner = CompiledRunner(model, backend="inductor", segment_len=32, segment_buckets=(32,), batch_widths=(1,))
    ids = torch.randint(0, 200, (40,)).tolist()
    with torch.inference_mode():
        l_c, s_c = runner.prefill(ids)
        l_e, s_e = EagerRunner(model, 32).prefill(ids)
    torch.testing.assert_close(l_c, l_e, rtol=1e-4, atol=1e-4)


def test_window_model_keeps_static_shapes():
    """The window mixer's shapes are fixed by S, W and the bucket: warm buckets never
    recompile however far rows have read, and the compiled numbers are eager's."""
    from tests.runtime.test_window import window_model

    model = window_model(combine="softmax", chunk_size=16)
    torch._dynamo.reset()
    counter = CompileCounter()
    runner = CompiledRunner(model, backend=counter, segment_len=64, batch_widths=(1, 2, 4))
    runner.warm_up()
    warmed = counter.frame_count
    assert warmed == len(runner.batch_widths) + len(runner.segment_buckets)
    eager = EagerRunner(model, segment_len=64)
    rng = random.Random(1)
    with torch.inference_mode():
        state_c = state_e = None
        for _ in range(6):
            ids = [rng.randrange(64) for _ in range(rng.randint(1, 90))]
            l_c, state_c = runner.prefill(ids, state_c)
            l_e, state_e = eager.prefill(ids, state_e)
            torch.testing.assert_close(l_c, l_e, rtol=1e-5, atol=1e-5)
            w = rng.randint(1, 4)
            runner.step(torch.randint(0, 64, (w,)), model.new_state(w))
        tok = torch.tensor([5])
        l_c, s_c = runner.step(tok, state_c)
        l_e, s_e = eager.step(tok, state_e)
    torch.testing.assert_close(l_c, l_e, rtol=1e-5, atol=1e-5)
    assert s_c.max_abs_diff(s_e) < 1e-5 and int(s_c.pos) == int(s_e.pos) == state_e.n_tokens + 1
    assert counter.frame_count == warmed
