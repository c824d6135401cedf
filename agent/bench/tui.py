"""TUI benchmark: does a long session open and scroll as fast as a short one, and how long
does a streamed token take to reach the screen?

Runs the real app headless (Textual's `run_test`) against the in-memory fake service, so it
measures the UI alone. Numbers (milliseconds unless named otherwise):

- open_ms[N]: app start to the first refresh after the session's tail is mounted, for a
  session of N turns (median of `repeats`). The promise: 5,000 turns ~ 10 turns; past one
  page (50 turns) only the history grows, never the widget count, so 5,000 ~ 50 exactly.
- page_older_ms: median time to fetch and mount one older page in the 5,000-turn session,
  and the most turn widgets ever alive while paging (`max_widgets_seen`).
- token_latency_ms: per token, from the worker posting the TokenEvent to the append that
  carried it being in the Markdown document (p50 / p95 / max), and the rate the UI absorbed;
  `streaming` paces tokens like a fast model, `streaming_burst` posts them all at once.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from agent.tui.factory import create_app
from agent.tui.fake_service import FakeChatService

SIZE = (120, 40)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _open_once(n_turns: int) -> tuple[float, int]:
    fake = FakeChatService(token_delay=0)
    fake.add_history(n_turns)
    start = time.perf_counter()
    app = create_app(fake)
    async with app.run_test(size=SIZE) as pilot:
        while app.tail_painted_at is None:
            await asyncio.sleep(0.001)
        elapsed = app.tail_painted_at - start
        widgets = len(app.chat.turn_widgets)
        await pilot.pause()
    return elapsed * 1000, widgets


async def _paging(n_turns: int, pages: int) -> dict[str, Any]:
    fake = FakeChatService(token_delay=0)
    fake.add_history(n_turns)
    app = create_app(fake)
    times: list[float] = []
    most = 0
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        chat = app.chat
        for _ in range(pages):
            first = chat.first_turn_id
            t0 = time.perf_counter()
            chat.request_older()
            while chat.first_turn_id == first or not chat.settled:
                await asyncio.sleep(0.001)
            times.append((time.perf_counter() - t0) * 1000)
            most = max(most, len(chat.turn_widgets))
    return {"page_older_ms": round(statistics.median(times), 2), "pages": pages, "max_widgets_seen": most,
            "widget_bound": app.max_turn_widgets}


async def _streaming(n_tokens: int, token_delay: float) -> dict[str, Any]:
    def reply(_: str) -> str:
        words = [f"word{i}" if i % 40 else f"\n\n## part {i // 40}\n\n" for i in range(n_tokens)]
        return " ".join(words)

    fake = FakeChatService(token_delay=token_delay, reply=reply)
    latencies: list[float] = []
    app = create_app(fake, latencies=latencies)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        t0 = time.perf_counter()
        app.start_job("send", lambda cancel: fake.send("go", cancel))
        while app.job is not None:
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - t0
        await pilot.pause()
    ms = [x * 1000 for x in latencies]
    return {
        "tokens": len(ms),
        "token_delay_ms": token_delay * 1000,
        "token_latency_ms": {"p50": round(_percentile(ms, 0.5), 2), "p95": round(_percentile(ms, 0.95), 2),
                             "max": round(max(ms), 2) if ms else None},
        "tokens_per_s_absorbed": round(len(ms) / wall, 1),
    }


async def _run(quick: bool) -> dict[str, Any]:
    repeats = 2 if quick else 5
    opened: dict[str, Any] = {}
    for n in (10, 50, 5000):  # 50 = one page: from there on only history grows, not widgets
        runs = [await _open_once(n) for _ in range(repeats)]
        opened[str(n)] = {"open_ms": round(statistics.median(r[0] for r in runs), 1), "widgets": runs[0][1]}
    return {
        "open": opened,
        "open_ratio_5000_vs_10": round(opened["5000"]["open_ms"] / opened["10"]["open_ms"], 2),
        "open_ratio_5000_vs_50": round(opened["5000"]["open_ms"] / opened["50"]["open_ms"], 2),
        "paging": await _paging(5000, 4 if quick else 12),
        "streaming": await _streaming(150 if quick else 1000, 0.002),  # a ~500 tok/s model
        "streaming_burst": await _streaming(300 if quick else 2000, 0.0),
        "quick": quick,
    }


def run_tui_bench(quick: bool = False) -> dict[str, Any]:
    """Run the TUI benchmark; returns a JSON-able dict (see the module docstring)."""
    return asyncio.run(_run(quick))


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_tui_bench(quick="--quick" in sys.argv), indent=2))
