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

    def finetune_memory(quick: bool) -> dict[str, Any]:
        from agent.bench.memory import bench_finetune_memory

        return bench_finetune_memory(quick)

    def store(quick: bool) -> dict[str, Any]:
        import tempfile
        from pathlib import Path

        from agent.bench.store import run_store_bench

        with tempfile.TemporaryDirectory(prefix="laplace-bench-") as tmp:
            return run_store_bench(Path(tmp), quick=quick)

    def train(quick: bool) -> dict[str, Any]:
        from agent.bench.train import run_train_bench

        return run_train_bench(quick)

    def tui(quick: bool) -> dict[str, Any]:
        from agent.bench.tui import run_tui_bench

        return run_tui_bench(quick)

    def cpu1b(quick: bool) -> dict[str, Any]:
        from agent.bench.cpu1b import bench_cpu1b

        return bench_cpu1b(quick)

    def llamacpp(quick: bool) -> dict[str, Any]:
        from agent.bench.llamacpp import bench_for_settings
        from agent.settings import Settings

        return bench_for_settings(Settings.from_env(), quick)  # the CLI passes its own Settings instead

    def dtype(quick: bool) -> dict[str, Any]:
        from agent.bench.dtype import bench_dtype

        return bench_dtype(quick)

    def window_memory(quick: bool) -> dict[str, Any]:
        from agent.bench.window_memory import bench_window_memory
        from agent.settings import Settings

        return bench_window_memory(quick, models_dir=Settings.from_env().models_dir)  # the CLI passes its own Settings instead

    def serve(quick: bool) -> dict[str, Any]:
        from pathlib import Path

        from agent.bench.serve import PilotConfig, run_pilot

        return run_pilot(PilotConfig.quick() if quick else PilotConfig(), Path("laplace-serve-report"))

    return {"kernel": kernel, "decode": decode, "batch": batch, "memory": memory, "finetune-memory": finetune_memory, "store": store, "train": train, "tui": tui,
            "cpu1b": cpu1b, "llamacpp": llamacpp, "dtype": dtype, "window-memory": window_memory, "serve": serve}
