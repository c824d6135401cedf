"""The sessions panel: list, switch, new, rename, fork, delete with confirmation, search."""

from __future__ import annotations

from textual.pilot import Pilot
from textual.widgets import Input, OptionList

from agent.tui.app import LaplaceApp
from agent.tui.dialogs import ConfirmScreen, TextInputScreen
from agent.tui.sessions_panel import SessionsScreen

from .fake_service import FakeChatService
from .helpers import run, until


def three_sessions() -> FakeChatService:
    fake = FakeChatService(token_delay=0)
    fake.add_history(4, name="alpha")
    fake.add_history(6, name="beta")
    fake.add_history(2, name="gamma")  # current (most recent)
    return fake


async def open_panel(app: LaplaceApp, pilot: Pilot) -> SessionsScreen:
    await pilot.press("ctrl+o")
    await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
    await pilot.pause()
    return app.screen  # type: ignore[return-value]


def labels(screen: SessionsScreen) -> list[str]:
    options = screen.query_one(OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def highlight(screen: SessionsScreen, pilot: Pilot, name: str) -> None:
    index = next(i for i, label in enumerate(labels(screen)) if f" {name} " in label)
    screen.query_one(OptionList).highlighted = index
    await pilot.pause()


def test_switch_to_another_session() -> None:
    fake = three_sessions()

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        screen = await open_panel(app, pilot)
        assert len(labels(screen)) == 3 and labels(screen)[0].startswith("● gamma")
        await highlight(screen, pilot, "beta")
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, SessionsScreen))
        assert app.service.session.name == "beta"  # type: ignore[union-attr]
        assert len(app.chat.turn_widgets) == 6
        assert "beta" in str(app.status_bar.render())

    run(scenario, fake)


def test_new_rename_and_fork_from_the_panel() -> None:
    fake = three_sessions()

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        screen = await open_panel(app, pilot)
        await highlight(screen, pilot, "alpha")
        await pilot.press("ctrl+r")  # rename: switches to alpha, then asks for the name
        await until(pilot, lambda: isinstance(app.screen, TextInputScreen))
        field = app.screen.query_one(Input)
        assert field.value == "alpha"
        field.value = "alpha renamed"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause()
        assert any("alpha renamed" in label for label in labels(app.screen))  # type: ignore[arg-type]
        await pilot.press("ctrl+f")  # fork the highlighted (now current) session
        await until(pilot, lambda: ("fork", None) in fake.calls)
        await pilot.pause()
        assert fake.session.name == "alpha renamed (fork)"  # type: ignore[union-attr]
        await pilot.press("ctrl+n")
        await until(pilot, lambda: not isinstance(app.screen, SessionsScreen))
        assert len(fake.list_sessions()) == 5 and app.chat.turn_widgets == []

    run(scenario, fake)
    assert ("rename", "alpha renamed") in fake.calls


def test_delete_asks_first_and_cancel_keeps_the_session() -> None:
    fake = three_sessions()

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        screen = await open_panel(app, pilot)
        await highlight(screen, pilot, "beta")
        await pilot.press("ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")  # the focused button is Cancel
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        assert not [c for c in fake.calls if c[0] == "delete_session"]
        await pilot.press("ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause()
        assert [s.name for s in fake.list_sessions()] == ["gamma", "alpha"]
        assert len(labels(app.screen)) == 2  # type: ignore[arg-type]
        # Deleting the current session leaves the user in the most recent remaining one.
        await highlight(app.screen, pilot, "gamma")  # type: ignore[arg-type]
        await pilot.press("ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#confirm")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.pause()
        assert fake.session.name == "alpha"  # type: ignore[union-attr]
        assert len(app.chat.turn_widgets) == 4

    run(scenario, fake)


def test_filter_and_full_text_search() -> None:
    fake = three_sessions()

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        screen = await open_panel(app, pilot)
        search = screen.query_one(Input)
        search.focus()
        await pilot.press("b", "e", "t")
        assert len(labels(screen)) == 1 and "beta" in labels(screen)[0]
        search.value = "what is 4 + 4"
        await pilot.press("enter")
        await pilot.pause()
        hits = labels(screen)
        assert hits and all("what is 4 + 4" in h for h in hits)
        assert any(h.startswith("beta") for h in hits)
        screen.query_one(OptionList).highlighted = next(i for i, h in enumerate(hits) if h.startswith("beta"))
        screen.query_one(OptionList).focus()
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, SessionsScreen))
        assert fake.session.name == "beta"  # type: ignore[union-attr]

    run(scenario, fake)
    assert ("search", "what is 4 + 4") in fake.calls


def test_hostile_session_names_are_shown_as_text() -> None:
    """A name with markup and escape sequences neither crashes the panel, the status bar
    nor the delete dialog, and no raw control character reaches the screen."""
    evil = "evil [/] [bold]x[/bold] \x1b]52;c;QQ==\x07 \x9b2J"
    fake = FakeChatService(token_delay=0)
    fake.add_history(2, name="alpha")
    fake.add_history(2, name=evil)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        status = str(app.status_bar.render())
        assert "evil [/] [bold]x[/bold] ␛]52;c;QQ==␇" in status and "\x1b" not in status
        screen = await open_panel(app, pilot)
        shown = labels(screen)
        assert any("evil [/] [bold]x[/bold] ␛]52" in label for label in shown)
        assert not any(c in label for label in shown for c in "\x1b\x07\x9b")
        await highlight(screen, pilot, "evil")
        await pilot.press("ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.pause()
        question = str(app.screen.query_one(".dialog-question").render())
        assert "evil [/] [bold]x[/bold]" in question and "\x1b" not in question

    run(scenario, fake)
