"""The prompt: a multi-line TextArea where Enter sends and ctrl+j (or shift/alt+enter where
the terminal reports them) inserts a newline.

Large pastes are held aside and shown as one placeholder line, `[paste #1: 1,048,576 chars,
20,001 lines]`, expanded back when the message is sent. Editing a megabyte in a TextArea
means re-wrapping and re-highlighting it on every keystroke; nobody edits a pasted log by
hand, and deleting the placeholder drops the paste.
"""

from __future__ import annotations

import re

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

PASTE_INLINE_LIMIT = 8_000  # characters; larger pastes become a placeholder
_PLACEHOLDER_RE = re.compile(r"\[paste #(\d+): [\d,]+ chars, [\d,]+ lines\]")


class PromptArea(TextArea):
    """Multi-line input. Posts `Submitted` with the full text (placeholders expanded)."""

    BINDINGS = [
        # Not priority bindings: those run at the App as soon as the key arrives, ahead of the
        # characters typed just before it that still wait in this widget's queue, so a fast
        # "text + Enter" (a paste, tmux send-keys) would submit an empty prompt. `_on_key`
        # below runs them in order with the typed characters instead.
        Binding("enter", "submit", "Send", id="submit"),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", id="newline"),
    ]

    class Submitted(Message):
        def __init__(self, prompt: PromptArea, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, tab_behavior="focus", show_line_numbers=False)
        self._pastes: dict[int, str] = {}
        self._next_paste = 1

    @property
    def full_text(self) -> str:
        """The text as it will be sent: placeholders replaced by what was pasted."""

        def expand(m: re.Match[str]) -> str:
            return self._pastes.get(int(m.group(1)), m.group(0))

        return _PLACEHOLDER_RE.sub(expand, self.text) if self._pastes else self.text

    def clear_prompt(self) -> None:
        self.clear()
        self._pastes.clear()

    async def _on_key(self, event: events.Key) -> None:
        # Our own bindings, as remapped by the app's keymap, win over TextArea's handling.
        keymap = getattr(self.app, "_keymap", {}) or {}
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding) and binding.id is not None
            keys = [k.strip() for k in keymap.get(binding.id, binding.key).split(",")]
            if event.key in keys:
                event.prevent_default()
                event.stop()
                getattr(self, f"action_{binding.action}")()
                return

    def action_submit(self) -> None:
        text = self.full_text
        if text.strip():
            self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_paste(self, event: events.Paste) -> None:
        # Textual calls `_on_paste` of every class in the MRO; returning here lets
        # TextArea's own handler insert a small paste, prevent_default() stops it.
        if self.read_only or len(event.text) <= PASTE_INLINE_LIMIT:
            return
        event.stop()
        event.prevent_default()
        n = self._next_paste
        self._next_paste += 1
        self._pastes[n] = event.text
        lines = event.text.count("\n") + 1
        self.insert(f"[paste #{n}: {len(event.text):,} chars, {lines:,} lines]")
