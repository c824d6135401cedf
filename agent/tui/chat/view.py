"""The transcript view: a bounded window of turn widgets over a session of any length.

The view holds at most `max_widgets` finished turns, a contiguous slice of the active
branch. It never talks to the service: when the user reaches the top (scroll, mouse wheel,
or the load-older key) it posts `EdgeReached("top")`, the app fetches
`service.page_before(first_turn_id)` and hands the page to `prepend`; pages far below are
dropped to keep the bound. Dropped newer pages are remembered as (turn id after the page,
count), which is enough to fetch them back with `page_before` or `tail` (the protocol has
no `page_after`). Reading position is preserved across prepends and drops, and the view is
anchored to the bottom (Textual's `anchor()`) unless the user scrolls away. Turns that only
the transcript still holds (`ChatServiceProtocol.transcript_only`) carry a quiet mark the app
renews after each reply and page load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from textual import events
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from agent.chat.types import TurnView

from .messages import MessageWidget, StreamingMessage


@dataclass(frozen=True)
class DroppedPage:
    after_id: int | None  # the first turn after the page, None when the page is the tail
    count: int
    first_id: int


class ChatView(VerticalScroll):
    """Turn widgets for a window of the active branch, plus the reply in flight."""

    class EdgeReached(Message):
        """The user reached an edge beyond which turns exist but are not loaded."""

        def __init__(self, edge: Literal["top", "bottom"]) -> None:
            super().__init__()
            self.edge = edge

    def __init__(self, *, page_size: int = 50, max_widgets: int = 150, id: str | None = None) -> None:
        super().__init__(id=id)
        self.page_size = page_size
        self.max_widgets = max(max_widgets, 2 * page_size)
        self.has_older = False
        self.newer: list[DroppedPage] = []
        self.loading = False
        self._quiet = 0  # >0 while our own mutations move the scroll position
        self._older_hint = Static("↑ older turns: scroll up or press the load-older key", classes="older-hint")

    # ---- queries ---------------------------------------------------------------------------

    @property
    def turn_widgets(self) -> list[MessageWidget]:
        return [w for w in self.children if isinstance(w, MessageWidget)]

    @property
    def streaming(self) -> StreamingMessage | None:
        for w in self.children:
            if isinstance(w, StreamingMessage):
                return w
        return None

    @property
    def first_turn_id(self) -> int | None:
        widgets = self.turn_widgets
        return widgets[0].turn_id if widgets else None

    @property
    def settled(self) -> bool:
        """No page is being loaded and no mutation is waiting to be laid out."""
        return not self.loading and not self._quiet

    @property
    def at_tail(self) -> bool:
        return not self.newer

    def widget_for(self, turn_id: int) -> MessageWidget | None:
        for w in self.turn_widgets:
            if w.turn_id == turn_id:
                return w
        return None

    # ---- loading ---------------------------------------------------------------------------

    async def show_tail(self, turns: list[TurnView]) -> None:
        """Replace everything with the newest turns of a session and stick to the bottom."""
        self._hush()
        await self.remove_children()
        self.newer.clear()
        self.has_older = bool(turns) and turns[0].parent_id is not None
        await self.mount(self._older_hint)
        self._older_hint.display = self.has_older
        await self.mount_all([MessageWidget(t) for t in turns])
        self.loading = False
        self.anchor()

    async def prepend(self, turns: list[TurnView]) -> None:
        """Mount an older page above the window, keeping the reading position."""
        try:
            self.has_older = bool(turns) and turns[0].parent_id is not None
            self._older_hint.display = self.has_older
            if not turns:
                return
            self._hush()
            keep = self._position_keeper(self.turn_widgets[:1])
            await self.mount_all([MessageWidget(t) for t in turns], after=self._older_hint)
            await self._drop(from_top=False)
            keep()
        finally:
            self.loading = False  # only now: a request during the mutation would interleave

    async def append_page(self, turns: list[TurnView]) -> None:
        """Mount a page that was dropped below (fetched again by the app)."""
        try:
            self._hush()
            keep = self._position_keeper(self.turn_widgets[-1:])
            await self.mount_all([MessageWidget(t) for t in turns], before=self.streaming)
            await self._drop(from_top=True)
            keep()
        finally:
            self.loading = False

    async def append_turn(self, turn: TurnView) -> MessageWidget:
        """A new turn at the end of the branch (the caller has made sure `at_tail`)."""
        self._hush()
        keep = self._position_keeper(self.turn_widgets[-1:])
        widget = MessageWidget(turn)
        await self.mount(widget, before=self.streaming)
        await self._drop(from_top=True)
        keep()
        return widget

    async def start_streaming(self, turn_id: int, latencies: list[float] | None = None) -> StreamingMessage:
        widget = StreamingMessage(turn_id, latencies)
        await self.mount(widget)
        return widget

    async def finish_turn(self, turn: TurnView) -> MessageWidget:
        """Replace the streaming widget (or an older widget of the same turn) by the final turn."""
        stream = self.streaming
        old = stream if stream is not None and stream.turn_id == turn.id else self.widget_for(turn.id)
        widget = MessageWidget(turn)
        if old is not None:
            await self.mount(widget, after=old)
            await old.remove()
            await self._drop(from_top=True)
            return widget
        return await self.append_turn(turn)

    def mark_transcript_only(self, turn_ids: set[int]) -> None:
        """Mark the turns only the transcript holds now (and unmark the rest). A mark can
        change a header's height (a narrow terminal wraps it), so the reading position is
        kept by the first turn in view, as page loads keep it."""
        widgets = self.turn_widgets
        if all(w.transcript_only == (w.turn_id in turn_ids) for w in widgets):
            return
        top = next((w for w in widgets if w.virtual_region.bottom > self.scroll_y), None)
        self._hush()
        keep = self._position_keeper([top] if top is not None else [])
        for w in widgets:
            w.mark_transcript_only(w.turn_id in turn_ids)
        keep()

    async def _drop(self, *, from_top: bool) -> None:
        """Remove the widgets furthest from where the user is until the bound holds."""
        widgets = self.turn_widgets
        extra = len(widgets) - self.max_widgets
        if extra <= 0:
            return
        if from_top:
            doomed = widgets[:extra]
            self.has_older = True
            self._older_hint.display = True
        else:
            doomed = widgets[-extra:]
            after_id = self.newer[-1].first_id if self.newer else None
            self.newer.append(DroppedPage(after_id=after_id, count=extra, first_id=doomed[0].turn_id))
        await self.remove_children(doomed)

    @property
    def following(self) -> bool:
        """True while the view sticks to the bottom (anchored and not scrolled away)."""
        return self._anchored and not self._anchor_released

    def _position_keeper(self, refs: list[MessageWidget]) -> Callable[[], None]:
        """Call before widgets are added or removed above the viewport; call what it returns
        after. It scrolls so that a surviving reference widget sits where it sat, so the text
        under the reader's eyes stays put (the view does not jump while the user reads).
        While following the bottom the anchor already does the right thing."""
        if self.following or not refs:
            return lambda: None
        ref = refs[0]
        offset = ref.virtual_region.y - self.scroll_y

        def adjust() -> None:
            if ref.is_attached:
                self.scroll_to(y=max(0, ref.virtual_region.y - offset), animate=False, immediate=True)

        return lambda: self.call_after_refresh(adjust)

    # ---- edges -------------------------------------------------------------------------------

    def _hush(self) -> None:
        """Ignore scroll-position changes until our mutation is laid out: removing or adding
        widgets clamps or moves scroll_y, which must not read as the user reaching an edge."""
        self._quiet += 1

        def settle() -> None:
            self._quiet -= 1

        # Two refreshes: one lays out the change, the next runs any position adjustment.
        self.call_after_refresh(lambda: self.call_after_refresh(settle))

    def _request(self, edge: Literal["top", "bottom"], *, user: bool = False) -> None:
        if self.loading or (self._quiet and not user):
            return
        if (edge == "top" and self.has_older) or (edge == "bottom" and self.newer):
            self.loading = True
            self.post_message(self.EdgeReached(edge))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.max_scroll_y <= 0:
            return  # nothing to scroll (or not laid out yet): a clamp, not the user at an edge
        if new_value <= 0 and old_value > 0:
            self._request("top")
        elif new_value >= self.max_scroll_y and old_value < new_value:
            self._request("bottom")

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        # Scrolling up with the view already at the top changes nothing, so the watcher
        # above never fires; the wheel itself is the request.
        if self.scroll_y <= 0:
            self._request("top", user=True)

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        if self.scroll_y >= self.max_scroll_y:
            self._request("bottom", user=True)

    def request_older(self) -> None:
        """The load-older key: go to the top of the window and fetch the page above it, so
        the reader sees where the older turns join (the view stops following the bottom)."""
        if self.scroll_y > 0:
            self.release_anchor()
            self.scroll_home(animate=False, immediate=True)
        self._request("top", user=True)

    def focused_message(self, focused: Widget | None) -> MessageWidget | None:
        """The message the user means: the focused one, else the last reply in view."""
        if isinstance(focused, MessageWidget) and focused.parent is self:
            return focused
        for w in reversed(self.turn_widgets):
            if w.turn.role == "assistant":
                return w
        widgets = self.turn_widgets
        return widgets[-1] if widgets else None
