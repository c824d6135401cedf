"""The sessions panel: a modal list of sessions with a filter/search box.

Typing filters the list by name or id; Enter in the box runs a full-text search over
transcripts and lists the hits. The screen never calls the service: it posts `Requested`
(switch, new, rename, fork, delete, search) and the app answers with `set_sessions` /
`set_hits`. Rename and fork act on the current session in the service's protocol, so the
app switches to the highlighted session first.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from agent.chat.types import SearchHit, SessionView
from agent.display import displayable, human_bytes



def session_label(s: SessionView, current: bool) -> str:
    mark = "●" if current else " "
    return (f"{mark} {displayable(s.name or '(unnamed)')}  ·  {s.uid[:8]}  ·  {s.turns:,} turns  ·  "
            f"{s.tokens_folded:,} tok  ·  {human_bytes(s.state_bytes)}  ·  {s.updated_at}")


def matches(s: SessionView, needle: str) -> bool:
    needle = needle.lower().strip()
    return not needle or needle in s.name.lower() or s.uid.lower().startswith(needle)


class SessionsScreen(ModalScreen[None]):
    """List, switch, create, rename, fork, delete and search sessions."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="sessions_close"),
        Binding("ctrl+n", "request('new')", "New", priority=True, id="sessions_new"),
        Binding("ctrl+r", "request('rename')", "Rename", priority=True, id="sessions_rename"),
        Binding("ctrl+f", "request('fork')", "Fork", priority=True, id="sessions_fork"),
        Binding("ctrl+d", "request('delete')", "Delete", priority=True, id="sessions_delete"),
        Binding("down", "focus_list", "List", show=False, id="sessions_list"),
    ]

    class Requested(Message):
        """The user asked for `action` on session `uid` (or for a search with `query`)."""

        def __init__(self, action: str, uid: str | None = None, query: str = "") -> None:
            super().__init__()
            self.action = action
            self.uid = uid
            self.query = query

    def __init__(self, sessions: list[SessionView], current_uid: str | None) -> None:
        super().__init__(classes="dialog-screen")
        self.sessions = sessions
        self.current_uid = current_uid
        self.hits: list[SearchHit] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog sessions"):
            yield Label("Sessions  (enter: open · ctrl+n new · ctrl+r rename · ctrl+f fork · "
                        "ctrl+d delete · type to filter, enter in the box to search transcripts)",
                        classes="dialog-question")
            yield Input(placeholder="filter by name or id; enter searches the transcripts", id="sessions-search")
            yield OptionList(id="sessions-list", markup=False)  # names and snippets are user text

    def on_mount(self) -> None:
        self._refill()
        self.query_one("#sessions-list", OptionList).focus()

    # ---- data from the app ---------------------------------------------------------------------

    def set_sessions(self, sessions: list[SessionView], current_uid: str | None) -> None:
        self.sessions, self.current_uid, self.hits = sessions, current_uid, None
        self._refill()

    def set_hits(self, hits: list[SearchHit]) -> None:
        self.hits = hits
        self._refill()

    def _refill(self) -> None:
        options = self.query_one("#sessions-list", OptionList)
        keep = options.highlighted_option.id if options.highlighted_option is not None else None
        keep = keep or (f"s:{self.current_uid}" if self.current_uid else None)
        options.clear_options()
        if self.hits is not None:
            if not self.hits:
                options.add_option(Option("no matches", id="none", disabled=True))
            for i, h in enumerate(self.hits):
                snippet = " ".join(h.snippet.split())
                options.add_option(Option(displayable(f"{h.session_name} · {h.role}: {snippet}"), id=f"hit:{i}"))
        else:
            needle = self.query_one("#sessions-search", Input).value
            for s in self.sessions:
                if matches(s, needle):
                    options.add_option(Option(session_label(s, s.uid == self.current_uid), id=f"s:{s.uid}"))
        if options.option_count:
            # Stay on the session the user was on (after a rename or delete), else the top.
            ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
            options.highlighted = ids.index(keep) if keep in ids else 0

    # ---- user input -----------------------------------------------------------------------------

    @property
    def highlighted_uid(self) -> str | None:
        options = self.query_one("#sessions-list", OptionList)
        option = options.highlighted_option
        if option is None or option.id is None:
            return None
        kind, _, key = option.id.partition(":")
        if kind == "s":
            return key
        if kind == "hit" and self.hits is not None:
            return self.hits[int(key)].session_uid
        return None

    def on_input_changed(self, event: Input.Changed) -> None:
        self.hits = None
        self._refill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip():
            self.post_message(self.Requested("search", query=event.value.strip()))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        uid = self.highlighted_uid
        if uid is not None:
            self.post_message(self.Requested("switch", uid))

    def action_request(self, action: str) -> None:
        uid = self.highlighted_uid
        if action != "new" and uid is None:
            self.notify("highlight a session first", severity="warning")
            return
        self.post_message(self.Requested(action, uid))

    def action_focus_list(self) -> None:
        self.query_one("#sessions-list", OptionList).focus()

    def action_close(self) -> None:
        self.dismiss(None)
