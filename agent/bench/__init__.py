"""`laplace bench`: each benchmark compares against a baseline measured in the same run.

A benchmark is a function `(quick: bool) -> dict` returning JSON-able results with a
`rows` list (for the table) and a `summary`. Speeds are ratios within one run, because
machines are noisy.
"""

from __future__ import annotations

from typing import Any, Callable

BenchFn = Callable[[bool], dict[str, Any]]


def registry() -> dict[str, BenchFn]:
    """Benchmarks by name; imported lazily so `laplace bench --help` stays light."""

    def kernel(quick: bool) -> dict[str, Any]:
        from agent.bench.runtime import bench_kernel

        return bench_kernel(quick)

    def decode(quick: bool) -> dict[str, Any]:
        from agent.bench.runtime import bench_decode

        return bench_decode(quick)

    def batch(quick: bool) -> dict[str, Any]:
        from agent.bench.runtime import bench_batch

        return bench_batch(quick)

    def memory(quick: bool) -> dict[str, Any]:
        from agent.bench.memory import bench_prefill_memory

        return bench_prefill_memory(quick)

    return {"kernel": kernel, "decode": decode, "batch": batch, "memory": memory}
