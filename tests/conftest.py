"""Shared fixtures: every test gets a private LAPLACE_HOME; tiny models are built in code."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _laplace_home(tmp_path, monkeypatch):
    home = tmp_path / "laplace-home"
    monkeypatch.setenv("LAPLACE_HOME", str(home))
    monkeypatch.delenv("LAPLACE_DEVICE", raising=False)
    monkeypatch.delenv("LAPLACE_DTYPE", raising=False)
    # No test downloads the default model's 93 MB teacher: a first use fails fast, offline.
    monkeypatch.setenv("LAPLACE_DEFAULT_MODEL_URL", "http://127.0.0.1:9/no-downloads-in-tests.whl")
    return home


@pytest.fixture(autouse=True)
def _bf16_is_slow(monkeypatch):
    """Whether bf16 is fast on a CPU is measured (device.cpu_bf16_speedup); tests must not
    depend on a timing, so they and the processes they start see the answer of a CPU
    without fast bf16 unless they set another (test_device.py uses a fake clock)."""
    monkeypatch.setenv("LAPLACE_BF16_SPEEDUP", "0")
    monkeypatch.setattr("agent.runtime.device.cpu_bf16_speedup", lambda: 0.0)
