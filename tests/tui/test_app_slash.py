"""Each slash command reaches the service and its result or error is shown; the startup
path for a state that cannot be used offers a rebuild with a progress bar."""

from __future__ import annotations

import threading
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import ProgressBar

from agent.chat.types import StateUnusableError
from agent.tui.app import LaplaceApp
from agent.tui.dialogs import HelpScreen, RebuildScreen

from .fake_service import FakeChatService
from .helpers import idle, notes, run, type_and_send, until


def test_session_commands_reach_the_service(tmp_path: Path) -> None:
    fake = FakeChatService(token_delay=0)
    fake.add_history(4, name="start")
    out = tmp_path / "s.json"

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "/rename project x")
        assert fake.session.name == "project x"  # type: ignore[union-attr]
        assert "project x" in str(app.status_bar.render())
        await type_and_send(app, pilot, "/set temperature 0.2")
        await type_and_send(app, pilot, "/set colour blue")  # the service rejects it
        await type_and_send(app, pilot, f"/export json {out}")
        await type_and_send(app, pilot, "/fork")
        assert fake.session.name == "project x (fork)"  # type: ignore[union-attr]
        assert len(app.chat.turn_widgets) == 4
        await type_and_send(app, pilot, "/system Be brief.")  # a new session, shown empty
        assert fake.session.system_prompt == "Be brief." and app.chat.turn_widgets == []  # type: ignore[union-attr]
        await type_and_send(app, pilot, "/new scratch")
        assert fake.session.name == "scratch" and app.chat.turn_widgets == []  # type: ignore[union-attr]
        await type_and_send(app, pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await type_and_send(app, pilot, "/bogus")
        assert app.prompt.text == "/bogus"  # kept so it can be fixed
        await type_and_send(app, pilot, "//slash is literal")
        await idle(app, pilot)
        said = "\n".join(notes(app))
        assert "unknown option 'colour'" in said
        assert f"exported to {out}" in said
        assert "unknown command /bogus" in said

    run(scenario, fake)
    assert ("set_system", "Be brief.") in fake.calls
    assert ("set_option", "temperature", "0.2") in fake.calls
    assert ("export", "json", out) in fake.calls and out.exists()
    assert ("fork", None) in fake.calls
    assert ("new_session", None, "scratch") in fake.calls
    assert ("send", "/slash is literal") in fake.calls


def test_attach_shows_progress_and_the_document(tmp_path: Path) -> None:
    fake = FakeChatService(token_delay=0.002)
    doc = tmp_path / "doc.txt"
    doc.write_text("lorem ipsum " * 4000)
    progress: list[float] = []

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        bar = app.query_one("#progress", ProgressBar)
        update = bar.update

        def spy(**kwargs: float) -> None:  # the bar moves too fast to catch on screen
            update(**kwargs)
            if bar.total:
                progress.append(bar.progress / bar.total)
                assert bar.display

        bar.update = spy  # type: ignore[method-assign]
        await type_and_send(app, pilot, f"/attach {doc}")
        await idle(app, pilot)
        assert not bar.display
        assert app.chat.turn_widgets[-1].turn.role == "document"
        await type_and_send(app, pilot, f"/attach {tmp_path / 'missing.txt'}")
        await idle(app, pilot)
        assert any("cannot read" in n for n in notes(app))

    run(scenario, fake)
    assert progress[-1] == 1.0 and progress == sorted(progress) and len(progress) > 3
    assert ("attach", doc) in fake.calls


def test_probe_shows_the_verdict() -> None:
    fake = FakeChatService(token_delay=0)
    fake.add_history(4)
    threads: list[threading.Thread] = []
    ask = fake.probe

    def probe(question: str, expected: str | None = None):  # noqa: ANN202 - records where it ran
        threads.append(threading.current_thread())
        return ask(question, expected)

    fake.probe = probe  # type: ignore[method-assign]

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "/probe what was question 1? => what is 2 + 2")
        await until(pilot, lambda: any("REMEMBERED" in n for n in notes(app)))
        await type_and_send(app, pilot, "/probe my cat? => Tom")
        await until(pilot, lambda: any("FORGOTTEN" in n for n in notes(app)))

    run(scenario, fake)
    assert ("probe", "my cat?", "Tom") in fake.calls
    # A probe runs the model for seconds: it must run in a worker thread, not on the UI loop.
    assert len(threads) == 2 and threading.main_thread() not in threads


def test_unusable_state_offers_a_rebuild_with_progress() -> None:
    fake = FakeChatService(token_delay=0.002)
    view = fake.add_history(40)
    fake.unusable.add(view.uid)
    try:
        fake.resume(view.uid[:6])
        raise AssertionError("expected StateUnusableError")
    except StateUnusableError as e:
        error = e

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, RebuildScreen))
        assert "saved by another model" in str(app.screen.query_one("Label").render())
        assert len(app.chat.turn_widgets) == 40  # the transcript is readable meanwhile
        await pilot.click("#rebuild")
        await idle(app, pilot)
        assert any("state rebuilt" in n for n in notes(app))
        assert not isinstance(app.screen, RebuildScreen)

    run(scenario, fake, startup_error=error)
    assert ("rebuild_state",) in fake.calls and not fake.unusable


def test_unusable_state_quit_exits() -> None:
    fake = FakeChatService(token_delay=0)
    fake.add_history(2)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, RebuildScreen))
        await pilot.click("#quit")
        await pilot.pause()

    app = run(scenario, fake, startup_error=StateUnusableError("checksum mismatch"))
    assert ("rebuild_state",) not in fake.calls
    assert app.return_code == 0
