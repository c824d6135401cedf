"""bf16 is fast where it measures fast: the decision for a CPU comes from a short matmul
timing, never from a table of device types (timed here with a fake clock)."""

from __future__ import annotations

import itertools

import torch

from agent.runtime import device


def fake_clock(fp32_s: float, bf16_s: float):
    """A clock under which each fp32 matmul takes fp32_s and each bf16 one bf16_s (the
    measurement alternates fp32, bf16 and reads the clock twice around each)."""
    t = itertools.accumulate(itertools.cycle([0.0, fp32_s, 0.0, bf16_s]))
    return lambda: next(t)


def test_speedup_is_the_ratio_of_the_best_times():
    assert device.bf16_matmul_speedup(n=8, repeats=3, clock=fake_clock(2.0, 1.0)) == 2.0
    assert device.bf16_matmul_speedup(n=8, repeats=3, clock=fake_clock(1.0, 50.0)) == 1 / 50


def test_cpu_decision_follows_the_measurement(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(device, "cpu_bf16_speedup", lambda: 2.1)
    assert device.has_fast_bf16(cpu) and device.matmul_dtype(cpu) == torch.bfloat16
    monkeypatch.setattr(device, "cpu_bf16_speedup", lambda: 1 / 50)
    assert not device.has_fast_bf16(cpu) and device.matmul_dtype(cpu) == torch.float32
    assert device.has_fast_bf16(torch.device("meta")) is False


def test_the_real_measurement_runs_and_gives_a_ratio():
    r = device.bf16_matmul_speedup(n=16, repeats=1)  # the value is the machine's; only its form is checked
    assert r > 0 and r != float("inf")


def test_the_environment_can_pin_the_ratio(monkeypatch):
    monkeypatch.undo()  # the real, cached function again (the autouse fixture had replaced it)
    monkeypatch.setenv("LAPLACE_BF16_SPEEDUP", "1.5")
    device.cpu_bf16_speedup.cache_clear()
    try:
        assert device.cpu_bf16_speedup() == 1.5 and device.has_fast_bf16(torch.device("cpu"))
    finally:
        device.cpu_bf16_speedup.cache_clear()
