"""Compiling for the server: a backend that logs every graph it compiles.

The Laplace 3B report saw a new decode batch width cost ~11 s of compilation mid-serving
(1.1% of steps, 47.5% of decode time). The scheduler pads every decode step to a fixed
width and every prefill segment to a fixed bucket, so all shapes are compiled at warm-up;
`CompileLog` wraps the real backend (Inductor, or Dynamo's `eager` for tests and quick
pilots) and records each compile with its duration and whether warm-up had finished, so
"no compile after warm-up" is a number the server reports, not a hope. The warm-up itself
is `CompiledRunner.warm_up`; `warm` is set after it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch

from agent.runtime.compiled import CompiledRunner
from agent.runtime.model import LaplaceModel


class CompileLog:
    """A torch.compile backend: hands each graph to `inner` and records that it did."""

    def __init__(self, inner: str | Callable[..., Any] = "inductor") -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.inner_name = inner if isinstance(inner, str) else getattr(inner, "__name__", "custom")
        self._inner = lookup_backend(inner) if isinstance(inner, str) else inner
        self.events: list[dict[str, Any]] = []
        self.warm = False
        self._lock = threading.Lock()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        t0 = time.perf_counter()
        compiled = self._inner(gm, example_inputs)
        shapes = [list(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)][:2]
        with self._lock:
            self.events.append({"seconds": round(time.perf_counter() - t0, 4), "after_warmup": self.warm,
                                "shapes": shapes, "at": time.time()})
        return compiled

    @property
    def after_warmup(self) -> int:
        with self._lock:
            return sum(1 for e in self.events if e["after_warmup"])

    def summary(self) -> dict[str, Any]:
        with self._lock:
            events = list(self.events)
        return {"backend": self.inner_name, "compiles": len(events),
                "compiles_after_warmup": sum(1 for e in events if e["after_warmup"]),
                "compile_seconds": round(sum(e["seconds"] for e in events), 3), "events": events}


def compiled_runner(model: LaplaceModel, *, widths: Sequence[int], backend: str = "inductor",
                    segment_len: int | None = None) -> tuple[CompiledRunner, CompileLog]:
    log = CompileLog(backend)
    return CompiledRunner(model, backend=log, batch_widths=tuple(widths), segment_len=segment_len), log
