"""What the scheduler counts, for `GET /v1/laplace/stats` and the serving pilot.

Decode steps by width (and by rows really in them, so padding waste is visible), prefill
segments, batch rebuilds, finished turns with their queue wait and time to first token,
refusals by status. Written by the scheduler thread, read by the HTTP side: one lock.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

RECENT = 64  # finished turns kept for the mean turn time (Retry-After)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.steps = 0
        self.step_seconds = 0.0
        self.widths: collections.Counter[int] = collections.Counter()
        self.rows: collections.Counter[int] = collections.Counter()
        self.row_slots = 0  # sum of real rows over steps
        self.width_slots = 0  # sum of widths over steps
        self.prefill_segments = 0
        self.prefill_tokens = 0
        self.prefill_seconds = 0.0
        self.rebuilds = 0
        self.statuses: collections.Counter[str] = collections.Counter()
        self.refusals: collections.Counter[int] = collections.Counter()
        self.completion_tokens = 0
        self._recent: collections.deque[float] = collections.deque(maxlen=RECENT)

    def step(self, rows: int, width: int, seconds: float) -> None:
        with self._lock:
            self.steps += 1
            self.step_seconds += seconds
            self.widths[width] += 1
            self.rows[rows] += 1
            self.row_slots += rows
            self.width_slots += width

    def prefill(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self.prefill_segments += 1
            self.prefill_tokens += tokens
            self.prefill_seconds += seconds

    def rebuild(self) -> None:
        with self._lock:
            self.rebuilds += 1

    def finished(self, status: str, tokens: int, timings: dict[str, float | None]) -> None:
        with self._lock:
            self.statuses[status] += 1
            self.completion_tokens += tokens
            if timings.get("total_s") is not None:
                self._recent.append(float(timings["total_s"]))  # type: ignore[arg-type]

    def refused(self, status: int) -> None:
        with self._lock:
            self.refusals[status] += 1

    def mean_turn_seconds(self) -> float | None:
        with self._lock:
            return sum(self._recent) / len(self._recent) if self._recent else None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            waste = 1 - self.row_slots / self.width_slots if self.width_slots else 0.0
            return {
                "uptime_s": round(time.time() - self.started, 3),
                "decode_steps": self.steps,
                "decode_seconds": round(self.step_seconds, 4),
                "width_histogram": {str(k): v for k, v in sorted(self.widths.items())},
                "rows_histogram": {str(k): v for k, v in sorted(self.rows.items())},
                "padding_waste": round(waste, 4),
                "prefill_segments": self.prefill_segments,
                "prefill_tokens": self.prefill_tokens,
                "prefill_seconds": round(self.prefill_seconds, 4),
                "batch_rebuilds": self.rebuilds,
                "turns": dict(self.statuses),
                "refused": {str(k): v for k, v in sorted(self.refusals.items())},
                "completion_tokens": self.completion_tokens,
            }
