"""What slash commands, the sessions panel and the help page do, as a mixin of LaplaceApp.

Kept apart from app.py so each file has one job: app.py owns layout, paging and streams;
this module turns user requests (already parsed by slash.py, or posted by the sessions
panel) into service calls and their feedback. Every `ChatError` becomes a notification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from textual import work
from textual.app import SystemCommand
from textual.binding import Binding

from agent.chat.types import FORGOTTEN, REMEMBERED, WEAK, ChatError, ProbeAnswer

from .chat.messages import MessageWidget
from .dialogs import ConfirmScreen, HelpScreen, TextInputScreen
from .keymap import binding_ids, bindings_markdown
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

if TYPE_CHECKING:
    from .app import LaplaceApp

    _Base = LaplaceApp
else:
    _Base = object

VERDICT_SEVERITY = {REMEMBERED: "information", WEAK: "warning", FORGOTTEN: "error"}


def known_bindings() -> dict[str, Binding]:
    """Every remappable binding of the TUI, by id (the app's own come first)."""
    from .app import LaplaceApp  # the app class imports this module

    return binding_ids([LaplaceApp.BINDINGS, PromptArea.BINDINGS, SessionsScreen.BINDINGS,
                        MessageWidget.BINDINGS, ConfirmScreen.BINDINGS])


class ActionsMixin(_Base):
    """Slash commands, session management and help for LaplaceApp."""

    # ---- the prompt ------------------------------------------------------------------------

    async def on_message_widget_sibling_requested(self, message: MessageWidget.SiblingRequested) -> None:
        """Show another version of a turn: the service moves the head to that branch."""
        if self.busy("switching versions"):
            return
        try:
            turn = self.service.switch_sibling(message.turn_id, message.step)
        except ChatError as e:
            self.say(str(e), "error")
            return
        await self.load_session()
        self.say(f"showing version {turn.sibling_index + 1} of {turn.sibling_count}", timeout=2)

    async def on_prompt_area_submitted(self, message: PromptArea.Submitted) -> None:
        text = message.text
        try:
            command = parse_slash(text)
        except SlashError as e:
            self.say(str(e), "error", timeout=8)  # the text stays in the prompt to be fixed
            return
        if command is None:
            if self.busy("sending another message"):
                return
            self.prompt.clear_prompt()
            body = unescape_message(text)
            self.start_job("send", lambda cancel: self.service.send(body, cancel))
            return
        self.prompt.clear_prompt()
        await self.run_slash(command)

    async def run_slash(self, cmd: SlashCommand) -> None:
        """Carry out one parsed slash command."""
        svc = self.service
        try:
            if isinstance(cmd, NewCmd):
                await self.switch_to(lambda: svc.new_session(name=cmd.name), "new session")
            elif isinstance(cmd, ForkCmd):
                await self.switch_to(lambda: svc.fork(), "forked into")
            elif isinstance(cmd, RenameCmd):
                view = svc.rename(cmd.name)
                self.refresh_status()
                self.say(f"renamed to {view.name}", timeout=3)
            elif isinstance(cmd, SystemCmd):
                # The service starts a new session (a state cannot un-read its old system
                # prompt), so the view must switch to it like /new does.
                text = cmd.text
                await self.switch_to(lambda: svc.set_system(text), "system prompt set in a new session:")
            elif isinstance(cmd, AttachCmd):
                path = cmd.path
                self.start_job("attach", lambda cancel: svc.attach(path, cancel))
            elif isinstance(cmd, ExportCmd):
                out = svc.export(cmd.fmt, cmd.path)
                self.say(f"exported to {out}", timeout=6)
            elif isinstance(cmd, ProbeCmd):
                if not self.busy("probing"):
                    self.status_bar.show(activity="probing…")
                    self._probe(cmd.question, cmd.expected)
            elif isinstance(cmd, SetCmd):
                svc.set_option(cmd.key, cmd.value)
                self.say(f"{cmd.key} = {cmd.value}", timeout=3)
            elif isinstance(cmd, HelpCmd):
                self.action_help()
        except ChatError as e:
            self.say(str(e), "error", timeout=8)

    @work(thread=True, group="probe", exit_on_error=False)
    def _probe(self, question: str, expected: str | None) -> None:
        # A probe runs the model on a copy of the state: seconds, so not on the UI loop.
        try:
            answer = self.service.probe(question, expected)
        except ChatError as e:
            self.call_from_thread(self.say, str(e), "error", 8)
        else:
            self.call_from_thread(self.show_probe, answer)
        finally:
            self.call_from_thread(self.status_bar.show, None, activity="")

    def show_probe(self, answer: ProbeAnswer) -> None:
        verdict = answer.verdict or "answer"
        text = f"probe: {answer.question}\n→ {answer.answer}\n{verdict}"
        if answer.expected is not None:
            text += f" (expected: {answer.expected})"
        if answer.detail:
            text += f"\n{answer.detail}"
        self.say(text, VERDICT_SEVERITY.get(answer.verdict or "", "information"), timeout=15)

    # ---- sessions ----------------------------------------------------------------------------

    async def switch_to(self, change: Callable[[], object], verb: str) -> bool:
        """Run a session-changing service call, then show the session it left us in."""
        if self.busy("switching sessions"):
            return False
        try:
            change()
        except ChatError as e:
            self.say(str(e), "error", timeout=8)
            return False
        await self.load_session()
        session = self.service.session
        if session is not None:
            self.say(f"{verb} {session.name or session.uid[:8]}", timeout=3)
        return True

    async def action_new_session(self) -> None:
        await self.switch_to(lambda: self.service.new_session(), "new session")

    def action_sessions(self) -> None:
        if isinstance(self.screen, SessionsScreen):
            return
        current = self.service.session
        self.push_screen(SessionsScreen(self.service.list_sessions(), current.uid if current else None))

    def _refresh_panel(self) -> None:
        if isinstance(self.screen, SessionsScreen):
            current = self.service.session
            self.screen.set_sessions(self.service.list_sessions(), current.uid if current else None)

    # Named by convention, not @on: Textual only registers @on handlers declared on the
    # MessagePump class itself, and this is a mixin.
    async def on_sessions_screen_requested(self, req: SessionsScreen.Requested) -> None:
        svc = self.service
        current = svc.session
        is_current = current is not None and req.uid == current.uid
        if req.action == "search":
            try:
                hits = svc.search(req.query)
            except ChatError as e:
                self.say(str(e), "error")
                return
            if isinstance(self.screen, SessionsScreen):
                self.screen.set_hits(hits)
        elif req.action == "new":
            if await self.switch_to(lambda: svc.new_session(), "new session"):
                self.screen.dismiss(None)
        elif req.action == "switch":
            if is_current or await self.switch_to(lambda: svc.resume(req.uid), "switched to"):
                self.screen.dismiss(None)
        elif req.action in ("rename", "fork"):
            if not is_current and not await self.switch_to(lambda: svc.resume(req.uid), "switched to"):
                return
            if req.action == "fork":
                await self.switch_to(lambda: svc.fork(), "forked into")
                self._refresh_panel()
            else:
                name = svc.session.name if svc.session else ""
                self.push_screen(TextInputScreen("New name for this session", name), self._rename_to)
        elif req.action == "delete":
            target = next((s for s in svc.list_sessions() if s.uid == req.uid), None)
            label = target.name if target else req.uid
            self.push_screen(ConfirmScreen(f"Delete session “{label}” and its whole transcript? "
                                           "This cannot be undone."),
                             lambda yes: self._delete(req.uid, is_current) if yes else None)

    def _rename_to(self, name: str | None) -> None:
        if not name:
            return
        try:
            self.service.rename(name)
        except ChatError as e:
            self.say(str(e), "error")
            return
        self.refresh_status()
        self._refresh_panel()

    async def _delete(self, uid: str | None, was_current: bool) -> None:
        if uid is None or (was_current and self.busy("deleting this session")):
            return
        try:
            self.service.delete_session(uid)
        except ChatError as e:
            self.say(str(e), "error")
            return
        self.say("session deleted", timeout=3)
        if was_current:
            # Leave the user somewhere sensible: the most recent session, or a fresh one.
            try:
                self.service.resume(None)
            except ChatError:
                self.service.new_session()
            await self.load_session()
        self._refresh_panel()

    # ---- help and the command palette --------------------------------------------------------

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        text = ("# Slash commands\n\n" + help_markdown() + "\n\n# Keys\n\nRemap any of these by id "
                "(keymap `{id = \"keys\"}`).\n\n" + bindings_markdown(known_bindings(), self._keymap))
        self.push_screen(HelpScreen(text))

    def slash_system_commands(self) -> Iterable[SystemCommand]:
        def slash(cmd: SlashCommand) -> Callable[[], None]:
            return lambda: self.call_later(self.run_slash, cmd)

        yield SystemCommand("Fork session", "/fork: copy this session and switch to it", slash(ForkCmd()))
        yield SystemCommand("Export as Markdown", "/export md", slash(ExportCmd("markdown", None)))
        yield SystemCommand("Export as JSON", "/export json", slash(ExportCmd("json", None)))
