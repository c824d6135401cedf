"""A long session opens at its tail and pages older turns on demand with a bounded number
of widgets, keeping the window contiguous in both directions."""

from __future__ import annotations

from textual.pilot import Pilot

from agent.tui.app import LaplaceApp

from .fake_service import fake_with_history
from .helpers import idle, run, type_and_send, until


def ids(app: LaplaceApp) -> list[int]:
    return [w.turn_id for w in app.chat.turn_widgets]


def contiguous(app: LaplaceApp) -> bool:
    got = ids(app)
    return got == list(range(got[0], got[0] + len(got)))


def test_5000_turns_open_at_the_tail_and_page_with_a_bounded_widget_count() -> None:
    fake = fake_with_history(5000)
    counts: list[int] = []

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        chat = app.chat
        assert ids(app) == list(range(4951, 5001))
        assert chat.has_older and chat.at_tail
        for _ in range(8):  # the load-older key, repeatedly
            first = chat.first_turn_id
            await pilot.press("ctrl+l")
            await until(pilot, lambda: chat.first_turn_id != first and chat.settled)
            counts.append(len(chat.children))
            assert contiguous(app)
        assert chat.first_turn_id == 4951 - 8 * 50
        assert not chat.at_tail  # newer pages were dropped...
        assert max(counts) <= app.max_turn_widgets + 3  # ...so the widget count stays bounded
        # Scrolling to the bottom brings dropped newer pages back, still contiguous.
        last = ids(app)[-1]
        chat.scroll_end(animate=False, immediate=True)
        await until(pilot, lambda: ids(app)[-1] != last and chat.settled)
        assert ids(app)[-1] == last + 50 and contiguous(app)
        assert len(chat.turn_widgets) <= app.max_turn_widgets
        # Scrolling to the top asks for older turns, like the key.
        first = chat.first_turn_id
        chat.scroll_home(animate=False, immediate=True)
        await until(pilot, lambda: chat.first_turn_id != first and chat.settled)
        assert contiguous(app) and len(chat.turn_widgets) <= app.max_turn_widgets
        # ...and keeps the reading position: the old first turn is still at the top.
        await pilot.pause()
        old_first = chat.widget_for(first)
        assert old_first is not None and abs(old_first.virtual_region.y - chat.scroll_y) <= 2
        # Jump back to the newest turns.
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert ids(app) == list(range(4951, 5001)) and chat.at_tail

    run(scenario, fake, page_size=50, max_turn_widgets=150)


def test_paging_stops_at_the_first_turn() -> None:
    fake = fake_with_history(120)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        chat = app.chat
        for _ in range(4):
            await pilot.press("ctrl+l")
            await until(pilot, lambda: app.chat.settled)
        assert ids(app) == list(range(1, 121))
        assert not chat.has_older

    run(scenario, fake, page_size=50, max_turn_widgets=150)


def test_sending_while_scrolled_back_returns_to_the_tail() -> None:
    fake = fake_with_history(400, token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        for _ in range(4):
            await pilot.press("ctrl+l")
            await until(pilot, lambda: app.chat.settled)
        assert not app.chat.at_tail
        await type_and_send(app, pilot, "new question")
        await idle(app, pilot)
        got = ids(app)
        assert got[-2:] == [401, 402] and app.chat.at_tail
        assert app.chat.turn_widgets[-2].turn.content == "new question"

    run(scenario, fake, page_size=50, max_turn_widgets=100)


def test_live_turns_keep_the_window_bounded() -> None:
    fake = fake_with_history(20, token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        for i in range(12):
            await type_and_send(app, pilot, f"q{i}")
            await idle(app, pilot)
        assert len(app.chat.turn_widgets) <= 20
        assert app.chat.has_older and contiguous(app)

    run(scenario, fake, page_size=10, max_turn_widgets=20)
