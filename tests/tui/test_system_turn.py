"""The system turn at the top of a session: a session started without a system prompt
stores an empty one, which is drawn as one dim line, not an empty "system" bubble."""

from __future__ import annotations

from textual.pilot import Pilot

from agent.tui.app import LaplaceApp


from .fake_service import FakeChatService
from .helpers import idle, run


def _drawn(w) -> str:  # type: ignore[no-untyped-def]
    """What the widget puts on screen, line by line."""
    return "\n".join(w.render_line(y).text for y in range(w.size.height))


def _first(app: LaplaceApp):  # type: ignore[no-untyped-def]
    widgets = app.chat.turn_widgets
    assert widgets and widgets[0].turn.role == "system"
    return widgets[0]


def test_an_empty_system_turn_is_one_dim_line() -> None:
    fake = FakeChatService()
    fake.add_history(2, system="")
    seen: dict[str, object] = {}

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await idle(app, pilot)
        w = _first(app)
        seen["text"] = _drawn(w)
        seen["height"] = w.outer_size.height
        seen["border"] = w.styles.border_left[0]

    run(scenario, fake)
    assert seen["text"].strip() == "no system prompt"  # type: ignore[union-attr]
    assert seen["height"] <= 2  # one line (plus the gap below every message), no bubble
    assert seen["border"] in ("", "none")


def test_a_system_prompt_is_still_drawn_as_a_message() -> None:
    fake = FakeChatService()
    fake.add_history(2, system="you are terse")
    seen: dict[str, str] = {}

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await idle(app, pilot)
        seen["text"] = _drawn(_first(app))

    run(scenario, fake)
    assert "system" in seen["text"] and "you are terse" in seen["text"]
