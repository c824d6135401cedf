"""Helpers for driving the TUI with Textual's Pilot from plain (sync) pytest tests.

pytest-asyncio is not a dependency, so each test is a sync function that runs its scenario
with `run(scenario, fake)`: the scenario is an async function of (app, pilot).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from textual.pilot import Pilot

from agent.tui import create_app
from agent.tui.app import LaplaceApp

from .fake_service import FakeChatService

Scenario = Callable[[LaplaceApp, Pilot], Awaitable[None]]


def run(scenario: Scenario, fake: FakeChatService, *, size: tuple[int, int] = (100, 40), **kwargs: object) -> LaplaceApp:
    app = create_app(fake, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await scenario(app, pilot)

    asyncio.run(main())
    return app


async def until(pilot: Pilot, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the app run until `condition()` holds (fails the test after `timeout`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.01)


async def idle(app: LaplaceApp, pilot: Pilot, timeout: float = 5.0) -> None:
    """Wait for the running stream (if any) to end and the UI to settle."""
    await until(pilot, lambda: app.job is None, timeout)
    await app.workers.wait_for_complete()
    await pilot.pause()


def notes(app: LaplaceApp) -> list[str]:
    """Texts of the notifications shown so far."""
    return [n.message for n in app._notifications]


async def type_and_send(app: LaplaceApp, pilot: Pilot, text: str) -> None:
    app.prompt.focus()
    app.prompt.clear_prompt()
    app.prompt.insert(text)
    await pilot.press("enter")
    await pilot.pause()
