"""What slash commands, the sessions panel and the help page do, for LaplaceApp.

Kept apart from app.py so each file has one job: app.py owns layout, paging and streams;
`SessionActions` turns user requests (already parsed by slash.py, or posted by the sessions
panel) into service calls and their feedback. Every `ChatError` becomes a notification.
The app holds one `SessionActions` and its message handlers delegate to it; this module
sees the app only through `ActionHost`, so it never imports app.py.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable, Mapping, Protocol

from textual.app import SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker

from agent.chat.types import FORGOTTEN, REMEMBERED, WEAK, ChatError, ChatServiceProtocol, ProbeAnswer

from .chat.messages import MessageWidget
from .dialogs import ConfirmScreen, HelpScreen, TextInputScreen
from .jobs import Job, JobKind, StreamFactory
from .keymap import bindings_markdown
from .prompt import PromptArea
from .sessions_panel import SessionsScreen
from .slash import (
    AttachCmd,
    ExportCmd,
    ForkCmd,
    HelpCmd,
    NewCmd,
    ProbeCmd,
    RenameCmd,
    SetCmd,
    SlashCommand,
    SlashError,
    SystemCmd,
    help_markdown,
    parse_slash,
    unescape_message,
)
from .status import StatusBar

VERDICT_SEVERITY = {REMEMBERED: "information", WEAK: "warning", FORGOTTEN: "error"}


class ActionHost(Protocol):
    """The part of LaplaceApp that SessionActions uses."""

    service: ChatServiceProtocol

    @property
    def prompt(self) -> PromptArea: ...

    @property
    def status_bar(self) -> StatusBar: ...

    @property
    def screen(self) -> Screen[Any]: ...

    @property
    def keymap(self) -> Mapping[str, str]: ...

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None: ...

    def busy(self, what: str = "that") -> bool: ...

    async def load_session(self) -> None: ...

    def refresh_status(self, activity: str | None = None) -> None: ...

    def start_job(self, kind: JobKind, factory: StreamFactory) -> Job | None: ...

    def push_screen(self, screen: Screen[Any], callback: Any = None) -> Any: ...

    def call_later(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> bool: ...

    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def run_worker(self, work: Any, name: str | None = "", group: str = "default", description: str = "",
                   exit_on_error: bool = True, start: bool = True, exclusive: bool = False,
                   thread: bool = False) -> Worker[Any]: ...


class SessionActions:
    """Slash commands, session management and help, carried out on `app`'s behalf.

    bindings: every remappable binding by id, for the keys table of the help page.
    """

    def __init__(self, app: ActionHost, bindings: Mapping[str, Binding]) -> None:
        self.app = app
        self.bindings = bindings

    # ---- the prompt ------------------------------------------------------------------------

    async def switch_sibling(self, message: MessageWidget.SiblingRequested) -> None:
        """Show another version of a turn: the service moves the head to that branch."""
        if self.app.busy("switching versions"):
            return
        try:
            turn = self.app.service.switch_sibling(message.turn_id, message.step)
        except ChatError as e:
            self.app.say(str(e), "error")
            return
        await self.app.load_session()
        self.app.say(f"showing version {turn.sibling_index + 1} of {turn.sibling_count}", timeout=2)

    async def submit(self, message: PromptArea.Submitted) -> None:
        text = message.text
        try:
            command = parse_slash(text)
        except SlashError as e:
            self.app.say(str(e), "error", timeout=8)  # the text stays in the prompt to be fixed
            return
        if command is None:
            if self.app.busy("sending another message"):
                return
            self.app.prompt.clear_prompt()
            body = unescape_message(text)
            self.app.start_job("send", lambda cancel: self.app.service.send(body, cancel))
            return
        self.app.prompt.clear_prompt()
        await self.run_slash(command)

    async def run_slash(self, cmd: SlashCommand) -> None:
        """Carry out one parsed slash command."""
        svc = self.app.service
        try:
            if isinstance(cmd, NewCmd):
                await self.switch_to(lambda: svc.new_session(name=cmd.name), "new session")
            elif isinstance(cmd, ForkCmd):
                await self.switch_to(lambda: svc.fork(), "forked into")
            elif isinstance(cmd, RenameCmd):
                view = svc.rename(cmd.name)
                self.app.refresh_status()
                self.app.say(f"renamed to {view.name}", timeout=3)
            elif isinstance(cmd, SystemCmd):
                # The service starts a new session (a state cannot un-read its old system
                # prompt), so the view must switch to it like /new does.
                text = cmd.text
                await self.switch_to(lambda: svc.set_system(text), "system prompt set in a new session:")
            elif isinstance(cmd, AttachCmd):
                path = cmd.path
                self.app.start_job("attach", lambda cancel: svc.attach(path, cancel))
            elif isinstance(cmd, ExportCmd):
                out = svc.export(cmd.fmt, cmd.path)
                self.app.say(f"exported to {out}", timeout=6)
            elif isinstance(cmd, ProbeCmd):
                if not self.app.busy("probing"):
                    self.app.status_bar.show(activity="probing…")
                    self._start_probe(cmd.question, cmd.expected)
            elif isinstance(cmd, SetCmd):
                svc.set_option(cmd.key, cmd.value)
                self.app.say(f"{cmd.key} = {cmd.value}", timeout=3)
            elif isinstance(cmd, HelpCmd):
                self.show_help()
        except ChatError as e:
            self.app.say(str(e), "error", timeout=8)

    def _start_probe(self, question: str, expected: str | None) -> None:
        # A probe runs the model on a copy of the state: seconds, so not on the UI loop.
        self.app.run_worker(partial(self._probe, question, expected), thread=True, group="probe",
                            exit_on_error=False)

    def _probe(self, question: str, expected: str | None) -> None:
        """Run in a worker thread: touches the UI only through call_from_thread."""
        try:
            answer = self.app.service.probe(question, expected)
        except ChatError as e:
            self.app.call_from_thread(self.app.say, str(e), "error", 8)
        else:
            self.app.call_from_thread(self.show_probe, answer)
        finally:
            self.app.call_from_thread(self.app.status_bar.show, None, activity="")

    def show_probe(self, answer: ProbeAnswer) -> None:
        verdict = answer.verdict or "answer"
        text = f"probe: {answer.question}\n→ {answer.answer}\n{verdict}"
        if answer.expected is not None:
            text += f" (expected: {answer.expected})"
        if answer.detail:
            text += f"\n{answer.detail}"
        self.app.say(text, VERDICT_SEVERITY.get(answer.verdict or "", "information"), timeout=15)

    # ---- sessions ----------------------------------------------------------------------------

    async def switch_to(self, change: Callable[[], object], verb: str) -> bool:
        """Run a session-changing service call, then show the session it left us in."""
        if self.app.busy("switching sessions"):
            return False
        try:
            change()
        except ChatError as e:
            self.app.say(str(e), "error", timeout=8)
            return False
        await self.app.load_session()
        session = self.app.service.session
        if session is not None:
            self.app.say(f"{verb} {session.name or session.uid[:8]}", timeout=3)
        return True

    async def new_session(self) -> None:
        await self.switch_to(lambda: self.app.service.new_session(), "new session")

    def open_sessions(self) -> None:
        if isinstance(self.app.screen, SessionsScreen):
            return
        current = self.app.service.session
        self.app.push_screen(SessionsScreen(self.app.service.list_sessions(), current.uid if current else None))

    def _refresh_panel(self) -> None:
        if isinstance(self.app.screen, SessionsScreen):
            current = self.app.service.session
            self.app.screen.set_sessions(self.app.service.list_sessions(), current.uid if current else None)

    async def sessions_request(self, req: SessionsScreen.Requested) -> None:
        svc = self.app.service
        current = svc.session
        is_current = current is not None and req.uid == current.uid
        if req.action == "search":
            try:
                hits = svc.search(req.query)
            except ChatError as e:
                self.app.say(str(e), "error")
                return
            if isinstance(self.app.screen, SessionsScreen):
                self.app.screen.set_hits(hits)
        elif req.action == "new":
            if await self.switch_to(lambda: svc.new_session(), "new session"):
                self.app.screen.dismiss(None)
        elif req.action == "switch":
            if is_current or await self.switch_to(lambda: svc.resume(req.uid), "switched to"):
                self.app.screen.dismiss(None)
        elif req.action in ("rename", "fork"):
            if not is_current and not await self.switch_to(lambda: svc.resume(req.uid), "switched to"):
                return
            if req.action == "fork":
                await self.switch_to(lambda: svc.fork(), "forked into")
                self._refresh_panel()
            else:
                name = svc.session.name if svc.session else ""
                self.app.push_screen(TextInputScreen("New name for this session", name), self._rename_to)
        elif req.action == "delete":
            target = next((s for s in svc.list_sessions() if s.uid == req.uid), None)
            label = target.name if target else req.uid
            self.app.push_screen(ConfirmScreen(f"Delete session “{label}” and its whole transcript? "
                                               "This cannot be undone."),
                                 lambda yes: self._delete(req.uid, is_current) if yes else None)

    def _rename_to(self, name: str | None) -> None:
        if not name:
            return
        try:
            self.app.service.rename(name)
        except ChatError as e:
            self.app.say(str(e), "error")
            return
        self.app.refresh_status()
        self._refresh_panel()

    async def _delete(self, uid: str | None, was_current: bool) -> None:
        if uid is None or (was_current and self.app.busy("deleting this session")):
            return
        try:
            self.app.service.delete_session(uid)
        except ChatError as e:
            self.app.say(str(e), "error")
            return
        self.app.say("session deleted", timeout=3)
        if was_current:
            # Leave the user somewhere sensible: the most recent session, or a fresh one.
            try:
                self.app.service.resume(None)
            except ChatError:
                self.app.service.new_session()
            await self.app.load_session()
        self._refresh_panel()

    # ---- help and the command palette --------------------------------------------------------

    def show_help(self) -> None:
        if isinstance(self.app.screen, HelpScreen):
            return
        text = ("# Slash commands\n\n" + help_markdown() + "\n\n# Keys\n\nRemap any of these by id "
                "(keymap `{id = \"keys\"}`).\n\n" + bindings_markdown(self.bindings, self.app.keymap))
        self.app.push_screen(HelpScreen(text))

    def slash_system_commands(self) -> Iterable[SystemCommand]:
        def slash(cmd: SlashCommand) -> Callable[[], None]:
            return lambda: self.app.call_later(self.run_slash, cmd)

        yield SystemCommand("Fork session", "/fork: copy this session and switch to it", slash(ForkCmd()))
        yield SystemCommand("Export as Markdown", "/export md", slash(ExportCmd("markdown", None)))
        yield SystemCommand("Export as JSON", "/export json", slash(ExportCmd("json", None)))
