"""Turns only the transcript holds (a window model's turns that left its window and memory)
carry a quiet mark, renewed after each reply, on resume and on page loads."""

from __future__ import annotations

from agent.chat.types import TurnView
from agent.tui.chat.messages import TRANSCRIPT_ONLY, header_text

from .fake_service import FakeChatService
from .helpers import idle, run, type_and_send, until

NOTE = TRANSCRIPT_ONLY.strip()


def screen_text(app) -> str:
    """What the terminal shows (the screenshot's SVG keeps the text, spaces as &#160;)."""
    return app.export_screenshot().replace("&#160;", " ")


def marked(app) -> set[int]:
    return {w.turn_id for w in app.chat.turn_widgets if w.transcript_only}


def test_the_header_says_so() -> None:
    assert NOTE in header_text("user", "complete", transcript_only=True).plain
    assert NOTE not in header_text("user", "complete").plain


def test_old_turns_are_marked_and_the_mark_follows_each_reply_and_resume() -> None:
    # 8 turns of 7 + 6 tokens; the fake holds the last 30: turns 1-3 (ending by token 20) are gone.
    fake = FakeChatService(token_delay=0, window=30)
    uid = fake.add_history(8).uid

    async def scenario(app, pilot) -> None:
        widgets = app.chat.turn_widgets
        assert marked(app) == {1, 2, 3}
        first, recent = widgets[0], widgets[-1]
        assert NOTE in first.header.plain and first.has_class("transcript-only")
        assert NOTE not in recent.header.plain and not recent.has_class("transcript-only")
        app.chat.release_anchor()
        app.chat.scroll_home(animate=False, immediate=True)
        await pilot.pause()
        assert NOTE in screen_text(app)

        # A reply pushes more turns out of what the state holds: their marks appear once it ends.
        assert 6 not in marked(app)
        await type_and_send(app, pilot, "hello")
        await idle(app, pilot)
        now = marked(app)
        assert {1, 2, 3, 6} <= now and now == fake.transcript_only([w.turn_id for w in app.chat.turn_widgets])
        assert app.chat.turn_widgets[-1].turn_id not in now

        # Another session has no old turns; back to this one, the marks are shown again.
        await app.actions.switch_to(lambda: fake.new_session(), "new session")
        assert marked(app) == set()
        await app.actions.switch_to(lambda: fake.resume(uid), "switched to")
        assert marked(app) == now

    run(scenario, fake)


def test_an_older_page_loads_with_its_marks() -> None:
    fake = FakeChatService(token_delay=0, window=30)
    fake.add_history(40)

    async def scenario(app, pilot) -> None:
        tail = {w.turn_id for w in app.chat.turn_widgets}
        assert min(tail) > 1 and marked(app) == fake.transcript_only(sorted(tail))
        await pilot.press("ctrl+l")
        await until(pilot, lambda: app.chat.first_turn_id is not None and app.chat.first_turn_id < min(tail)
                    and app.chat.settled)
        older = {w.turn_id for w in app.chat.turn_widgets} - tail
        assert older and older <= marked(app)

    run(scenario, fake, page_size=10)


def test_a_model_without_exact_tokens_marks_nothing() -> None:
    fake = FakeChatService(token_delay=0)  # window None: the question does not apply
    fake.add_history(8)

    async def scenario(app, pilot) -> None:
        await type_and_send(app, pilot, "hello")
        await idle(app, pilot)
        assert marked(app) == set() and NOTE not in screen_text(app)

    run(scenario, fake)


def test_an_empty_system_turn_stays_one_line_when_marked() -> None:
    fake = FakeChatService(token_delay=0, window=1)
    fake.add_history(2, system="")
    fake._turns[1] = TurnView(1, "system", "", "complete", n_tokens=3)  # the template's framing, read

    async def scenario(app, pilot) -> None:
        system = app.chat.turn_widgets[0]
        assert system.transcript_only and "no system prompt" in str(system.render())
        assert NOTE not in str(system.render())

    run(scenario, fake)
