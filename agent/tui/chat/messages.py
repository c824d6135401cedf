"""Message widgets: a cheap one for finished turns and a streaming one for the reply in flight.

A finished turn is one focusable `Static` holding a Rich renderable (Rich Markdown for
replies, plain text otherwise), so hundreds of them cost little. Only the reply being
generated uses Textual's `Markdown` widget (one child widget per block), fed by
`ReplyStream`, which coalesces tokens the way Textual's `MarkdownStream` does but also
records how long each token waited before it reached the document (the TUI benchmark's
frame-latency number).
"""

from __future__ import annotations

import asyncio
import re
import time

from rich.console import Group, RenderableType
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from agent.display import displayable
from agent.chat.types import TurnView

# Rendering a megabyte of text into the transcript would stall layout; the full content is
# still stored, exported and copied (copy works on the turn, not on what is displayed).
DISPLAY_LIMIT = 20_000

_FENCE_RE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)

ROLE_LABELS = {"user": "you", "assistant": "laplace", "system": "system", "document": "document"}
RECALL_LABEL = "↺ recalled from earlier"
NO_SYSTEM_PROMPT = "no system prompt"
USED_RECALL = "  ↺ used recall"
TRANSCRIPT_ONLY = "  held only by the transcript; refresh can bring it back"


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks in `markdown`, in order (an unclosed fence at
    the end of a cancelled reply counts as a block)."""
    blocks = [m.group(2) for m in _FENCE_RE.finditer(markdown)]
    closed_end = max((m.end() for m in _FENCE_RE.finditer(markdown)), default=0)
    tail = re.search(r"^(`{3,}|~{3,})[^\n]*\n(.*)\Z", markdown[closed_end:], re.MULTILINE | re.DOTALL)
    if tail:
        blocks.append(tail.group(2))
    return blocks


def header_text(role: str, status: str, sibling_index: int = 0, sibling_count: int = 1, *,
                kind: str = "", used_recall: bool = False, unread: bool = False,
                transcript_only: bool = False) -> Text:
    """The one-line header over a message: role, branch position, unusual status, the
    recall-refresh marks (a recall block; a reply written after one), whether the state
    has not read it (`unread`: e.g. a cancelled attach), and whether the state read it but
    no longer holds any of its tokens exactly (`transcript_only`: a window model's turn
    that left its window and memory)."""
    text = Text(RECALL_LABEL if kind == "recall" else ROLE_LABELS.get(role, role), style="bold")
    if used_recall:
        text.append(USED_RECALL, style="italic cyan")
    if sibling_count > 1:
        text.append(f"  {sibling_index + 1}/{sibling_count}", style="dim")
    if status == "streaming":
        text.append("  generating…", style="italic dim")
    elif status != "complete":
        text.append(f"  [{status}]", style="bold red" if status == "error" else "bold yellow")
    if unread:
        text.append("  not read into the state", style="italic dim")
    if transcript_only:
        text.append(TRANSCRIPT_ONLY, style="italic dim")
    return text


def turn_header(turn: TurnView, *, transcript_only: bool = False) -> Text:
    return header_text(turn.role, turn.status, turn.sibling_index, turn.sibling_count, kind=turn.kind,
                       used_recall=turn.used_recall, unread=is_unread(turn), transcript_only=transcript_only)


def is_unread(turn: TurnView) -> bool:
    """A stopped turn that stored text but no token ids: the state never read that text."""
    return turn.status in ("cancelled", "error") and turn.n_tokens == 0 and bool(turn.content)


def recall_summary(turn: TurnView) -> Text:
    """A recall block folded away: how many earlier lines it repeated, and how to see them."""
    lines = [line for line in turn.content.splitlines()[1:] if line.strip()]
    return Text(f"{len(lines)} line{'s' if len(lines) != 1 else ''} from earlier turns read again before "
                f"the next message ({turn.n_tokens} tokens); focus and press enter to show",
                style="italic dim")


def is_empty_system(turn: TurnView) -> bool:
    """A session started without a system prompt still stores an (empty) system turn: the
    template's framing was read into the state. It is drawn as one dim line, not a bubble."""
    return turn.role == "system" and not turn.content.strip()


def message_body(turn: TurnView, expanded: bool = False) -> RenderableType:
    if turn.kind == "recall" and not expanded:
        return recall_summary(turn)
    content = displayable(turn.content)
    note: Text | None = None
    if len(content) > DISPLAY_LIMIT:
        hidden = len(content) - DISPLAY_LIMIT
        content = content[:DISPLAY_LIMIT]
        note = Text(f"… {hidden:,} more characters not shown (copy or export for the full text)",
                    style="italic dim")
    body: RenderableType
    if turn.role == "assistant":
        body = RichMarkdown(content, code_theme="monokai")
    else:
        body = Text(content)
    return Group(body, note) if note is not None else body


class MessageWidget(Static, can_focus=True):
    """One finished turn. Focus it (click, tab, up/down) to copy it or its code blocks."""

    BINDINGS = [
        Binding("up", "neighbour(-1)", "Previous message", show=False, id="message_prev"),
        Binding("down", "neighbour(1)", "Next message", show=False, id="message_next"),
        Binding("left", "sibling(-1)", "Previous version", show=False, id="sibling_prev"),
        Binding("right", "sibling(1)", "Next version", show=False, id="sibling_next"),
        Binding("enter", "toggle_recall", "Show recalled text", show=False, id="toggle_recall"),
    ]

    class SiblingRequested(Message):
        """The user asked to see another version (sibling) of this turn."""

        def __init__(self, turn_id: int, step: int) -> None:
            super().__init__()
            self.turn_id = turn_id
            self.step = step

    def __init__(self, turn: TurnView) -> None:
        header = turn_header(turn)
        # Content given at construction, not on mount: the first layout then already has the
        # real height, which keeping the reading position across page loads relies on.
        # An empty system turn keeps its widget (paging counts turns) but is one dim line.
        empty = is_empty_system(turn)
        content = Text(NO_SYSTEM_PROMPT, style="italic dim") if empty else Group(header, message_body(turn))
        super().__init__(content, classes=f"message role-{turn.role} status-{turn.status}" + (" recall" if turn.kind else "")
                         + (" empty-system" if empty else ""))
        self.turn = turn
        self.header = header
        self.expanded = False
        self.transcript_only = False

    def action_toggle_recall(self) -> None:
        """Show or fold away the text of a recall block (other messages ignore it)."""
        if self.turn.kind != "recall":
            return
        self.expanded = not self.expanded
        self.update(Group(self.header, message_body(self.turn, self.expanded)))

    def mark_transcript_only(self, on: bool) -> None:
        """Show (or drop) the note that only the transcript holds this turn now (re-rendered
        only when that changes). An empty system turn stays its one dim line."""
        if on == self.transcript_only:
            return
        self.transcript_only = on
        self.set_class(on, "transcript-only")
        self.header = turn_header(self.turn, transcript_only=on)
        if not is_empty_system(self.turn):
            self.update(Group(self.header, message_body(self.turn, self.expanded)))

    @property
    def turn_id(self) -> int:
        return self.turn.id

    def action_sibling(self, step: int) -> None:
        if self.turn.sibling_count > 1:
            self.post_message(self.SiblingRequested(self.turn.id, step))

    def action_neighbour(self, step: int) -> None:
        siblings = [w for w in self.parent.children if isinstance(w, MessageWidget)] if self.parent else []
        i = siblings.index(self) + step
        if 0 <= i < len(siblings):
            siblings[i].focus()
            siblings[i].scroll_visible(animate=False)


class ReplyStream:
    """Feeds tokens to a Markdown widget, batching whatever arrived while the last append
    was being laid out. `latencies` receives, per token, seconds from `posted_at` to the
    append that carried it having finished."""

    def __init__(self, markdown: Markdown, latencies: list[float] | None = None) -> None:
        self.markdown = markdown
        self.latencies = latencies
        self.text = ""
        self._pending: list[str] = []
        self._stamps: list[float] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def write(self, fragment: str, posted_at: float | None = None) -> None:
        if not fragment:
            return
        self.text += fragment
        self._pending.append(displayable(fragment))
        if posted_at is not None:
            self._stamps.append(posted_at)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            chunk, stamps = "".join(self._pending), self._stamps
            self._pending, self._stamps = [], []
            await self.markdown.append(chunk)
            if self.latencies is not None and stamps:
                done = time.perf_counter()
                self.latencies.extend(done - s for s in stamps)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class StreamingMessage(Vertical):
    """The reply being generated: a header and a growing Markdown document."""

    def __init__(self, turn_id: int, latencies: list[float] | None = None) -> None:
        super().__init__(classes="message role-assistant status-streaming")
        self.turn_id = turn_id
        # Built here, not in compose, so tokens written before mount are queued, not lost.
        self._markdown = Markdown(classes="reply-markdown")
        self.stream = ReplyStream(self._markdown, latencies)

    def compose(self) -> ComposeResult:
        yield Static(header_text("assistant", "streaming"), classes="message-header")
        yield self._markdown

    def on_mount(self) -> None:
        self.stream.start()

    def write(self, fragment: str, posted_at: float | None = None) -> None:
        self.stream.write(fragment, posted_at)

    @property
    def text(self) -> str:
        return self.stream.text

    def on_unmount(self) -> None:
        self.stream.stop()
