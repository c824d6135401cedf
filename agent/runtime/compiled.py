"""A compiled runner: `torch.compile(dynamic=False, fullgraph=True)` over fixed shape buckets.

Compilers that reject symbolic shapes (TorchNeuron) compile every distinct shape, and a new
shape mid-session costs seconds to minutes (the reference deployment saw 11 s per new decode
width). So every call is padded to a small, fixed set of buckets:

- decode: batch widths, e.g. (1, 2, 4, 8); padded rows are independent and dropped;
- prefill: segment lengths that are multiples of the chunk, e.g. (128, 256, 512) at batch 1;
  padded positions are masked (`lengths`) so they neither write nor decay the state.

Each compiled function sees at most 8 shapes, Dynamo's default cache limit, so warming the
buckets once means no recompilation afterwards (tested with a counting backend).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from agent.runtime.generation import EagerRunner
from agent.runtime.model import LaplaceModel
from agent.runtime.state import RecurrentState

DYNAMO_SHAPE_LIMIT = 8


def default_segment_buckets(chunk_size: int, segment_len: int) -> tuple[int, ...]:
    """Powers of two times the chunk, up to the segment length (at most 4 buckets)."""
    buckets, b = [], chunk_size
    while b < segment_len:
        buckets.append(b)
        b *= 2
    buckets.append(segment_len)
    return tuple(buckets[-4:])


class CompiledRunner(EagerRunner):
    """EagerRunner with compiled, bucketed `step` and `forward_segment`."""

    def __init__(
        self,
        model: LaplaceModel,
        *,
        backend: str | Callable[..., Any] = "inductor",
        segment_len: int | None = None,
        segment_buckets: Sequence[int] | None = None,
        batch_widths: Sequence[int] = (1, 2, 4, 8),
    ) -> None:
        segment_len = segment_len or max(model.config.chunk_size * 4, 128)
        super().__init__(model, segment_len)
        chunk = model.config.chunk_size
        self.segment_buckets = tuple(sorted(segment_buckets or default_segment_buckets(chunk, segment_len)))
        self.batch_widths = tuple(sorted(batch_widths))
        if any(b % chunk for b in self.segment_buckets):
            raise ValueError(f"segment buckets {self.segment_buckets} must be multiples of the chunk size {chunk}")
        if self.segment_buckets[-1] != segment_len:
            raise ValueError("the largest segment bucket must equal the segment length")
        if len(self.segment_buckets) > DYNAMO_SHAPE_LIMIT or len(self.batch_widths) > DYNAMO_SHAPE_LIMIT:
            raise ValueError(f"at most {DYNAMO_SHAPE_LIMIT} buckets per compiled function (Dynamo's cache limit)")

        # The state goes in and out as its dict of named tensors (a fixed set per model).
        def decode(ids: Tensor, tensors: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            logits, st = model(ids, RecurrentState(tensors))
            return logits[:, -1], st.tensors

        def prefill(ids: Tensor, tensors: dict[str, Tensor], lengths: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            logits, st = model(ids, RecurrentState(tensors), lengths=lengths, last_only=True)
            return logits[:, -1], st.tensors

        self._decode = torch.compile(decode, backend=backend, dynamic=False, fullgraph=True)
        self._prefill = torch.compile(prefill, backend=backend, dynamic=False, fullgraph=True)

    def _width(self, n: int) -> int:
        for w in self.batch_widths:
            if w >= n:
                return w
        raise ValueError(f"batch of {n} exceeds the largest compiled width {self.batch_widths[-1]}")

    def step(self, tokens: Tensor, state: RecurrentState) -> tuple[Tensor, RecurrentState]:
        n = tokens.shape[0]
        w = self._width(n)
        ids = torch.zeros(w, 1, dtype=torch.long, device=tokens.device)
        ids[:n, 0] = tokens
        padded = state.padded_to(w)
        logits, tensors = self._decode(ids, padded.tensors)
        # The graph's per-layer tensors; the count (positions and n_tokens) as the state keeps it.
        layers = RecurrentState(tensors).first_rows(n).layer_tensors
        new = state.advanced(layers, 1)
        new.meta = dict(state.meta)
        return logits[:n], new

    def step_(self, tokens: Tensor, state: RecurrentState) -> Tensor:
        """`step`, its new layer tensors copied into `state` (the compiled graph is
        functional), then the state's count advanced."""
        logits, new = self.step(tokens, state)
        for name, t in new.layer_tensors.items():
            state.tensors[name].copy_(t)
        state.advance_(1)
        return logits

    def forward_segment(self, ids: Tensor, state: RecurrentState, lengths: Tensor | None) -> tuple[Tensor, RecurrentState]:
        b, length = ids.shape
        bucket = next((s for s in self.segment_buckets if s >= length), None)
        if bucket is None:
            raise ValueError(f"segment of {length} tokens exceeds the largest bucket {self.segment_buckets[-1]}")
        padded = torch.zeros(b, bucket, dtype=torch.long, device=ids.device)
        padded[:, :length] = ids
        if lengths is None:
            lengths = torch.full((b,), length, dtype=torch.long, device=ids.device)
        logits, tensors = self._prefill(padded, state.tensors, lengths)
        return logits, RecurrentState(tensors, state.n_tokens, state.meta)

    def warm_up(self) -> dict[str, float]:
        """Compile every bucket once (decode widths, then prefill lengths), timing each call
        (Dynamo's tracing included, which a backend's own time leaves out)."""
        timings: dict[str, float] = {}
        with torch.inference_mode():
            for w in self.batch_widths:
                t0 = time.perf_counter()
                self.step(torch.zeros(w, dtype=torch.long, device=self.device), self.model.new_state(w))
                timings[f"decode_w{w}"] = round(time.perf_counter() - t0, 3)
            for s in self.segment_buckets:
                t0 = time.perf_counter()
                self.forward_segment(torch.zeros(1, s, dtype=torch.long, device=self.device), self.model.new_state(1), None)
                timings[f"prefill_{s}"] = round(time.perf_counter() - t0, 3)
        return timings
