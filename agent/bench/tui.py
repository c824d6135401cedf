"""TUI benchmark: does a long session open and scroll as fast as a short one, and how long
does a streamed token take to reach the screen?

Runs the real app headless (Textual's `run_test`) over the real chat service and session
store, in a temporary data directory, with the untrained `tiny` model. The sessions'
histories are written straight to the store as text (turns without token ids, so each
session's state, its system prompt's, agrees with its transcript and opens without a
replay); opening and paging then read SQLite as `laplace chat` does. Streamed tokens are
scripted events fed to the app's job runner, paced like a fast model or all at once, so the
token numbers are the UI's alone. Numbers (milliseconds unless named otherwise):

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
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from agent.chat.types import ChatEvent, StatsEvent, TokenEvent, TurnFinished, TurnStarted, TurnView
from agent.tui.factory import create_app

if TYPE_CHECKING:
    from agent.chat.service import ChatService

SIZE = (120, 40)
PAGE = 50  # the app's page size (create_app's default)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _service(home: Path) -> ChatService:
    from agent.chat.service import ChatService
    from agent.runtime.checkpoint import load_model
    from sessions import SessionStore

    return ChatService(SessionStore.open(home / "laplace.db"), load_model("tiny"), model_id="tiny")


def _history(service: ChatService, n_turns: int) -> str:
    """A new session holding `n_turns` alternating user/assistant turns, stored as text; its uid."""
    uid = service.new_session(name=f"history-{n_turns}").uid
    store = service.store
    with store.core.transaction():
        for i in range(n_turns):
            if i % 2 == 0:
                store.turns.begin_turn(uid, role="user", content=f"question {i // 2}: what is {i} + {i}?")
            else:
                turn = store.turns.begin_turn(uid, role="assistant")
                store.turns.commit_turn(turn.id, content=f"Answer {i // 2}: **{i - 1 + i - 1}**.\n\n```\n{i}\n```")
    return uid


async def _open_once(service: ChatService) -> tuple[float, int]:
    start = time.perf_counter()
    app = create_app(service)
    async with app.run_test(size=SIZE) as pilot:
        while app.tail_painted_at is None:
            await asyncio.sleep(0.001)
        elapsed = app.tail_painted_at - start
        widgets = len(app.chat.turn_widgets)
        await pilot.pause()
    return elapsed * 1000, widgets


async def _paging(service: ChatService, pages: int) -> dict[str, Any]:
    app = create_app(service)
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


SCRIPTED_ID = 1 << 40  # ids of the scripted turns: above any the store hands out


def _scripted(n_tokens: int, token_delay: float, cancel: threading.Event) -> Iterator[ChatEvent]:
    """A reply of `n_tokens` words (a heading every 40), as events a service would stream."""
    words = [f"word{i}" if i % 40 else f"\n\n## part {i // 40}\n\n" for i in range(n_tokens)]
    pieces = re.findall(r"\s*\S+|\s+", " ".join(words))
    yield TurnStarted(TurnView(SCRIPTED_ID, "user", "go", "complete"), SCRIPTED_ID + 1)
    for piece in pieces:
        if cancel.is_set():
            break
        if token_delay:
            time.sleep(token_delay)
        yield TokenEvent(piece)
    yield StatsEvent(new_tokens=len(pieces), tokens_per_s=0.0, tokens_folded=0, state_bytes=0)
    yield TurnFinished(TurnView(SCRIPTED_ID + 1, "assistant", "".join(pieces), "complete", SCRIPTED_ID, len(pieces)))


async def _streaming(service: ChatService, n_tokens: int, token_delay: float) -> dict[str, Any]:
    latencies: list[float] = []
    app = create_app(service, latencies=latencies)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        t0 = time.perf_counter()
        app.start_job("send", lambda cancel: _scripted(n_tokens, token_delay, cancel))
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


async def _run(service: ChatService, quick: bool, long: int) -> dict[str, Any]:
    repeats = 2 if quick else 5
    opened: dict[str, Any] = {}
    sessions = {n: _history(service, n) for n in (10, 50, long)}  # 50 = one page: from there on only history grows
    for n, uid in sessions.items():
        service.resume(uid)  # as `laplace chat --session UID` does before the app starts
        runs = [await _open_once(service) for _ in range(repeats)]
        opened[str(n)] = {"open_ms": round(statistics.median(r[0] for r in runs), 1), "widgets": runs[0][1]}
    # The long session is the one open; page only as far back as it has whole older pages.
    paging = await _paging(service, min(4 if quick else 12, long // PAGE - 1))
    service.new_session(name="streaming")
    return {
        "open": opened,
        f"open_ratio_{long}_vs_10": round(opened[str(long)]["open_ms"] / opened["10"]["open_ms"], 2),
        f"open_ratio_{long}_vs_50": round(opened[str(long)]["open_ms"] / opened["50"]["open_ms"], 2),
        "paging": paging,
        "streaming": await _streaming(service, 150 if quick else 1000, 0.002),  # a ~500 tok/s model
        "streaming_burst": await _streaming(service, 300 if quick else 2000, 0.0),
        "quick": quick,
    }


def run_tui_bench(quick: bool = False, long: int = 5000) -> dict[str, Any]:
    """Run the TUI benchmark in a temporary data directory; returns a JSON-able dict (see the
    module docstring). `long` is the long session's turn count."""
    with tempfile.TemporaryDirectory(prefix="laplace-bench-tui-") as home:
        service = _service(Path(home))
        try:
            return asyncio.run(_run(service, quick, long))
        finally:
            service.close()
            service.store.close()


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_tui_bench(quick="--quick" in sys.argv), indent=2))
