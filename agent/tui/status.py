"""The status bar: model, device, tokens folded into the state, state size, the KV cache a
softmax model would need for the same history, and the speed of the last reply.

`format_status` is pure so the wording is tested without the UI.
"""

from __future__ import annotations

from textual.widgets import Static

from agent.chat.types import StatusView
from agent.display import displayable, human_bytes


def format_status(view: StatusView | None, *, activity: str = "") -> str:
    """One line for the status bar. `activity` is e.g. "generating" or "attaching 3/10"."""
    if view is None:
        return activity or "no session"
    parts = [
        f"{view.model} · {view.device}",
        view.session_name or (view.session_uid or "")[:8] or "no session",
        f"{view.tokens_folded:,} tokens folded",
        f"state {human_bytes(view.state_bytes)}",
        f"KV cache would be {human_bytes(view.kv_cache_bytes)}",
    ]
    if view.last_tokens_per_s is not None:
        parts.append(f"{view.last_tokens_per_s:.1f} tok/s")
    if activity:
        parts.append(activity)
    return displayable(" │ ".join(parts))  # session names are user text


class StatusBar(Static):
    """Docked at the bottom; the app pushes a fresh `StatusView` after every change."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.view: StatusView | None = None
        self.activity = ""

    def show(self, view: StatusView | None = None, *, activity: str | None = None) -> None:
        if view is not None:
            self.view = view
        if activity is not None:
            self.activity = activity
        self.update(format_status(self.view, activity=self.activity))
