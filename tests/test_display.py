"""agent/display.py: model output shown in a terminal cannot carry control sequences; sizes."""

from __future__ import annotations

from agent.display import displayable, human_bytes
from agent.tui.chat.messages import message_body
from agent.chat.types import TurnView


def test_controls_become_visible_symbols_and_text_survives():
    evil = "ok\x1b]52;c;aGVsbG8=\x07 \x1b[2J\x9b31m\x7f\tend\n"
    shown = displayable(evil)
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in shown)
    assert not any(0x7F <= ord(c) < 0xA0 for c in shown)
    assert shown.startswith("ok\u241b]52;c;aGVsbG8=\u2407") and shown.endswith("\tend\n")
    assert displayable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_transcript_rendering_uses_the_safe_text():
    body = message_body(TurnView(1, "user", "hi\x1b[2J", "complete"))
    assert "\x1b" not in body.plain and "\u241b[2J" in body.plain


def test_human_bytes() -> None:
    assert human_bytes(999) == "999 B"
    assert human_bytes(29_500_000) == "29.5 MB"
    assert human_bytes(1_500) == "1.5 kB"
