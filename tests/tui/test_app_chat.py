"""Chat behaviour through the real app and the fake service: streaming, cancel, regenerate,
copy, paste, keymap, quitting mid-reply, the command palette."""

from __future__ import annotations

import threading

from textual.events import Paste
from textual.pilot import Pilot

from agent.tui.app import LaplaceApp
from agent.tui.chat.messages import MessageWidget, StreamingMessage
from agent.tui.prompt import PASTE_INLINE_LIMIT

from .fake_service import FakeChatService
from .helpers import idle, notes, run, type_and_send, until


def long_reply(_: str) -> str:
    return "word " * 400




def test_reply_streams_into_the_view_then_becomes_a_finished_turn() -> None:
    fake = FakeChatService(token_delay=0.001, hold_after=8)
    seen_streaming: list[str] = []

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "hello model")
        await until(pilot, lambda: app.chat.streaming is not None and "Here is" in app.chat.streaming.text)
        seen_streaming.append(app.chat.streaming.text)  # type: ignore[union-attr]
        markdown = app.chat.streaming.query_one("Markdown")  # type: ignore[union-attr]
        await until(pilot, lambda: "Here is" in markdown.source)  # on screen, not just buffered
        assert app.prompt.text == ""  # the prompt is cleared as soon as the message is sent
        assert "generating" in str(app.status_bar.render())
        fake.release.set()
        await idle(app, pilot)
        widgets = app.chat.turn_widgets
        assert [w.turn.role for w in widgets] == ["user", "assistant"]
        assert widgets[0].turn.content == "hello model"
        assert widgets[1].turn.status == "complete"
        assert "print('hello')" in widgets[1].turn.content
        assert not app.chat.query(StreamingMessage)
        assert app.latencies is None

    run(scenario, fake)
    assert fake.calls[-1] == ("send", "hello model")
    assert seen_streaming and seen_streaming[0].startswith("You said")


def test_escape_cancels_and_the_turn_shows_cancelled() -> None:
    fake = FakeChatService(token_delay=0.001, reply=long_reply, hold_after=30)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "talk a lot")
        await until(pilot, lambda: app.chat.streaming is not None and len(app.chat.streaming.text) > 20)
        await pilot.press("escape")
        await idle(app, pilot)
        last = app.chat.turn_widgets[-1]
        assert last.turn.status == "cancelled"
        assert "[cancelled]" in last.header.plain
        assert 0 < len(last.turn.content) < len(long_reply(""))

    run(scenario, fake)
    assert len(fake.cancelled) == 1


def test_sending_while_busy_is_refused_not_queued() -> None:
    fake = FakeChatService(token_delay=0.001, reply=long_reply, hold_after=5)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "first")
        await type_and_send(app, pilot, "second")
        assert any("wait for the current send" in n for n in notes(app))
        assert app.prompt.text == "second"  # kept for later
        await pilot.press("escape")
        await idle(app, pilot)

    run(scenario, fake)
    assert [c for c in fake.calls if c[0] == "send"] == [("send", "first")]


def test_regenerate_replaces_the_reply_and_shows_the_branch() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "hi")
        await idle(app, pilot)
        await pilot.press("ctrl+r")
        await idle(app, pilot)
        widgets = app.chat.turn_widgets
        assert [w.turn.role for w in widgets] == ["user", "assistant"]
        assert (widgets[1].turn.sibling_index, widgets[1].turn.sibling_count) == (1, 2)
        assert "2/2" in widgets[1].header.plain

    run(scenario, fake)
    assert ("regenerate",) in fake.calls


def test_left_and_right_on_a_reply_switch_between_its_versions() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "hi")
        await idle(app, pilot)
        first = app.chat.turn_widgets[-1].turn
        await pilot.press("ctrl+r")
        await idle(app, pilot)
        app.chat.turn_widgets[-1].focus()
        await pilot.press("left")
        await idle(app, pilot)
        shown = app.chat.turn_widgets[-1].turn
        assert shown.id == first.id and (shown.sibling_index, shown.sibling_count) == (0, 2)
        assert "1/2" in app.chat.turn_widgets[-1].header.plain
        app.chat.turn_widgets[-1].focus()
        await pilot.press("right")
        await idle(app, pilot)
        assert app.chat.turn_widgets[-1].turn.sibling_index == 1

    run(scenario, fake)
    assert [c for c in fake.calls if c[0] == "switch_sibling"][0][2] == -1


def test_copy_message_and_code_blocks() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "code please")
        await idle(app, pilot)
        await pilot.press("ctrl+g")
        assert app.clipboard == "echo done\n"  # the last block first
        await pilot.press("ctrl+g")
        assert app.clipboard == "print('hello')\n"  # again: the one before
        await pilot.press("ctrl+t")
        assert app.clipboard.startswith("You said")
        app.chat.turn_widgets[0].focus()  # a focused message is the one copied
        await pilot.pause()
        await pilot.press("ctrl+t")
        assert app.clipboard == "code please"
        await pilot.press("down")  # up/down walk between messages
        assert isinstance(app.focused, MessageWidget) and app.focused.turn.role == "assistant"

    run(scenario, fake)


def test_multiline_input_and_a_megabyte_paste() -> None:
    fake = FakeChatService(token_delay=0)
    big = ("x" * 99 + "\n") * 10_486  # ~1 MB, 10k lines

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        app.prompt.focus()
        await pilot.press("a", "ctrl+j", "b")
        assert app.prompt.text == "a\nb"
        app.prompt.clear_prompt()
        await pilot.press("l", "o", "g", "space")
        app.post_message(Paste(big))  # as the driver delivers it
        await pilot.pause()
        assert len(app.prompt.text) < 100 and "[paste #1:" in app.prompt.text
        await pilot.press("enter")
        await idle(app, pilot)
        # A small paste goes in as text.
        app.post_message(Paste("short"))
        await pilot.pause()
        assert app.prompt.text == "short"

    run(scenario, fake)
    sent = [c[1] for c in fake.calls if c[0] == "send"]
    assert sent == ["log " + big]
    assert len(big) > PASTE_INLINE_LIMIT


def test_keymap_remaps_by_binding_id() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        app.prompt.focus()
        await pilot.press("h", "i", "enter")  # enter no longer sends: it is a newline now
        assert app.prompt.text == "hi\n"
        await pilot.press("ctrl+s")
        await idle(app, pilot)

    run(scenario, fake, keymap={"submit": "ctrl+s"})
    assert fake.calls[-1] == ("send", "hi\n")


def test_quitting_mid_reply_cancels_and_waits_for_the_store() -> None:
    fake = FakeChatService(token_delay=0.001, reply=long_reply, hold_after=10)
    done: list[bool] = []

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "go")
        await until(pilot, lambda: app.chat.streaming is not None and len(app.chat.streaming.text) > 5)
        job = app.job
        await pilot.press("ctrl+q")
        done.append(job is not None and job.done.is_set())

    run(scenario, fake)
    assert done == [True]
    assert len(fake.cancelled) == 1


def test_command_palette_lists_the_actions() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ["Stop", "Regenerate", "Sessions", "New", "Copy msg", "Copy code", "Help", "Fork session",
                      "Export as Markdown"]:
            assert title in titles
        await pilot.press("f1")
        assert type(app.screen).__name__ == "HelpScreen"

    run(scenario, fake)


def test_status_bar_shows_model_device_state_and_speed() -> None:
    fake = FakeChatService(token_delay=0)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "hi")
        await idle(app, pilot)
        line = str(app.status_bar.render())
        for part in ["fake-gla-3b", "cpu", "tokens folded", "state 29.5 MB", "KV cache would be", "tok/s"]:
            assert part in line

    run(scenario, fake)


def test_worker_runs_off_the_ui_thread() -> None:
    threads: list[str] = []

    def reply(text: str) -> str:
        threads.append(threading.current_thread().name)
        return "ok"

    fake = FakeChatService(token_delay=0, reply=reply)

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        await type_and_send(app, pilot, "hi")
        await idle(app, pilot)

    run(scenario, fake)
    assert threads and threads[0] != threading.main_thread().name
