"""Recall refresh in the TUI: the block shows as a folded note that enter expands, and the
reply written after it carries a mark."""

from __future__ import annotations

from agent.chat.types import TurnView
from agent.tui.chat.messages import USED_RECALL, MessageWidget, header_text, message_body

from .fake_service import FakeChatService
from .helpers import idle, run, type_and_send

BLOCK = "Recalled from earlier in this conversation:\n\nUser: My locker code is 48213."


def screen_text(app) -> str:
    """What the terminal shows (the screenshot's SVG keeps the text, spaces as &#160;)."""
    return app.export_screenshot().replace("&#160;", " ")


def test_header_and_body_of_a_recall_block_and_of_the_reply_after_it() -> None:
    block = TurnView(3, "document", BLOCK, "complete", n_tokens=40, kind="recall")
    assert "recalled" in header_text("document", "complete", kind="recall").plain
    folded = message_body(block).plain
    assert "48213" not in folded and "1 line" in folded and "enter" in folded
    assert "48213" in message_body(block, expanded=True).plain
    assert USED_RECALL.strip() in header_text("assistant", "complete", used_recall=True).plain
    assert USED_RECALL.strip() not in header_text("assistant", "complete").plain


def test_a_send_with_recall_shows_the_note_then_expands_it() -> None:
    fake = FakeChatService(token_delay=0)
    fake.new_session()
    fake.next_recall = BLOCK

    async def scenario(app, pilot) -> None:
        await type_and_send(app, pilot, "What is my locker code?")
        await idle(app, pilot)
        widgets = app.chat.turn_widgets
        roles = [(w.turn.role, w.turn.kind) for w in widgets]
        assert roles[-3:] == [("document", "recall"), ("user", ""), ("assistant", "")]
        note, reply = widgets[-3], widgets[-1]
        assert reply.turn.used_recall and USED_RECALL.strip() in reply.header.plain
        assert "48213" not in screen_text(app) and "1 line from earlier" in screen_text(app)
        note.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert note.expanded and "48213" in screen_text(app)
        await pilot.press("enter")
        await pilot.pause()
        assert not note.expanded and "48213" not in screen_text(app)
        # A reload from the service shows the same note and mark.
        await app.load_session()
        again = app.chat.turn_widgets
        assert again[-3].turn.kind == "recall" and again[-1].turn.used_recall
        assert isinstance(again[-3], MessageWidget)

    run(scenario, fake)
