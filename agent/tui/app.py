"""The Laplace TUI: transcript, prompt, progress bar, status bar; generation in worker threads.

Only `create_app` builds it (the CLI and tests call the factory). The app talks to the chat
service through `ChatServiceProtocol` alone. Streaming calls (send, regenerate, attach,
rebuild_state) run in a worker thread (see jobs.py); quick calls (tail, page_before, status,
list_sessions, rename, ...) run on the UI thread, possibly while a stream is being consumed
in the worker, so the service must allow that. Session-changing calls wait until no stream
is running. What slash commands, the sessions panel and the help page do lives in
`actions.py` (`SessionActions`); the handlers Textual calls by name here delegate to it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Iterable, Mapping

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar

from agent.chat.types import (
    ChatError,
    ChatServiceProtocol,
    ErrorEvent,
    ProgressEvent,
    StatsEvent,
    StateUnusableError,
    TokenEvent,
    TurnFinished,
    TurnStarted,
)
from agent.display import displayable

from .actions import SessionActions
from .chat.messages import MessageWidget, code_blocks
from .chat.view import ChatView
from .dialogs import ConfirmScreen, RebuildScreen
from .jobs import Job, JobEnded, JobEvent, JobKind, StreamFactory, consume
from .keymap import binding_ids
from .prompt import PromptArea
from .sessions_panel import SessionsScreen
from .status import StatusBar

QUIT_GRACE_S = 3.0  # how long quitting waits for a cancelled reply to be stored


class LaplaceApp(App[None]):
    """Chat with one session at a time; see the module docstring for the threading rules."""

    CSS_PATH = "laplace.tcss"
    TITLE = "laplace"

    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True, id="quit"),
        Binding("escape", "cancel", "Stop", id="cancel"),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate"),
        Binding("ctrl+o", "sessions", "Sessions", id="sessions"),
        Binding("ctrl+n", "new_session", "New", id="new_session"),
        Binding("ctrl+t", "copy_message", "Copy msg", id="copy_message"),
        Binding("ctrl+g", "copy_code", "Copy code", id="copy_code"),
        Binding("ctrl+l", "load_older", "Older", show=False, id="load_older"),
        Binding("ctrl+b", "jump_latest", "Latest", show=False, id="jump_latest"),
        Binding("f1", "help", "Help", id="help"),
    ]

    def __init__(
        self,
        service: ChatServiceProtocol,
        *,
        keymap: Mapping[str, str] | None = None,
        startup_error: StateUnusableError | None = None,
        page_size: int = 50,
        max_turn_widgets: int = 150,
        latencies: list[float] | None = None,
    ) -> None:
        super().__init__()
        self.service = service
        self.startup_error = startup_error
        self.page_size = page_size
        self.max_turn_widgets = max_turn_widgets
        self.latencies = latencies  # per-token post->document seconds, for the benchmark
        self.user_keymap = dict(keymap or {})
        self.job: Job | None = None
        self._job_ids = 0
        self._code_cursor: tuple[int, int] | None = None  # (turn id, block index) last copied
        self.tail_painted_at: float | None = None
        self.actions = SessionActions(self, known_bindings())

    # ---- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield ChatView(page_size=self.page_size, max_widgets=self.max_turn_widgets, id="chat")
        yield ProgressBar(id="progress", show_eta=False)
        yield PromptArea(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    @property
    def chat(self) -> ChatView:
        return self.query_one("#chat", ChatView)

    @property
    def prompt(self) -> PromptArea:
        return self.query_one("#prompt", PromptArea)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one("#status", StatusBar)

    @property
    def progress(self) -> ProgressBar:
        return self.query_one("#progress", ProgressBar)

    @property
    def keymap(self) -> Mapping[str, str]:
        """The user's binding overrides, by binding id (as given to `set_keymap`)."""
        return self._keymap

    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None:
        """A notification whose text is never read as markup (service messages hold brackets)."""
        self.notify(displayable(message), severity=severity, timeout=timeout, markup=False)  # type: ignore[arg-type]

    async def on_mount(self) -> None:
        if self.user_keymap:
            self.set_keymap(self.user_keymap)
        self.progress.display = False
        self.prompt.focus()
        if self.startup_error is not None:
            await self.load_session()
            self.push_screen(RebuildScreen(str(self.startup_error).rstrip(".")), self._on_rebuild_choice)
            return
        if self.service.session is None:
            try:
                self.service.new_session()
            except ChatError as e:
                self.say(str(e), "error")
        await self.load_session()

    async def load_session(self) -> None:
        """Show the tail of the current session and refresh the status bar."""
        try:
            turns = self.service.tail(self.page_size) if self.service.session is not None else []
        except ChatError as e:
            self.say(str(e), "error")
            turns = []
        await self.chat.show_tail(turns)
        self.mark_held()
        self.refresh_status()
        self.call_after_refresh(self._mark_painted)

    def mark_held(self) -> None:
        """Mark the turns in view that only the transcript holds now (after each reply and
        page load; a quick service call). A mark is a hint: a failed call changes nothing."""
        try:
            ids = self.service.transcript_only([w.turn_id for w in self.chat.turn_widgets])
        except ChatError:
            return
        if ids is not None:
            self.chat.mark_transcript_only(ids)

    def _mark_painted(self) -> None:
        self.tail_painted_at = time.perf_counter()

    def refresh_status(self, activity: str | None = None) -> None:
        try:
            view = self.service.status()
        except ChatError:
            view = None
        self.status_bar.show(view, activity=activity)

    # ---- paging ------------------------------------------------------------------------------

    @on(ChatView.EdgeReached)
    async def _page(self, event: ChatView.EdgeReached) -> None:
        chat = self.chat
        try:
            if event.edge == "top":
                first = chat.first_turn_id
                turns = self.service.page_before(first, self.page_size) if first is not None else []
                await chat.prepend(turns)
                self.mark_held()
            elif chat.newer:
                page = chat.newer.pop()
                if page.after_id is None:
                    turns = self.service.tail(page.count)
                else:
                    turns = self.service.page_before(page.after_id, page.count)
                await chat.append_page(turns)
                self.mark_held()
        except ChatError as e:
            chat.loading = False
            self.say(str(e), "error")

    def action_load_older(self) -> None:
        self.chat.request_older()

    async def action_jump_latest(self) -> None:
        if not self.chat.at_tail:
            await self.load_session()
        self.chat.anchor()

    # ---- streaming jobs --------------------------------------------------------------------

    def busy(self, what: str = "that") -> bool:
        """True (and says so) while a stream runs: one turn at a time per session."""
        if self.job is None:
            return False
        self.say(f"wait for the current {self.job.kind} to finish (Esc stops it) before {what}", "warning")
        return True

    def start_job(self, kind: JobKind, factory: StreamFactory) -> Job | None:
        if self.busy(f"starting a {kind}"):
            return None
        self._job_ids += 1
        job = Job(self._job_ids, kind)
        self.job = job
        self._code_cursor = None
        self.status_bar.show(activity={"send": "generating…", "regenerate": "regenerating…",
                                       "attach": "attaching…", "rebuild": "rebuilding state…"}[kind])
        self._run_job(job, factory)
        return job

    @work(thread=True, group="stream", exit_on_error=False)
    def _run_job(self, job: Job, factory: StreamFactory) -> None:
        consume(self, job, factory)

    async def on_job_event(self, message: JobEvent) -> None:
        job = self.job
        if job is None or message.job_id != job.id:
            return  # a late event from a job we already gave up on
        event, chat = message.event, self.chat
        if isinstance(event, TokenEvent):
            stream = chat.streaming
            if stream is not None:
                stream.write(event.text, message.posted_at)
        elif isinstance(event, TurnStarted):
            self.progress.display = False  # a long message's fold (if any) is done; the reply starts
            if not chat.at_tail:
                await self.load_session()
            # The worker runs ahead of the UI: a reload may already hold the finished reply.
            early = chat.widget_for(event.assistant_turn_id)
            if early is not None:
                await early.remove()
            recall = event.recall_turn
            if recall is not None and chat.widget_for(recall.id) is None:
                await chat.append_turn(recall)
            if event.user_turn is not None and chat.widget_for(event.user_turn.id) is None:
                await chat.append_turn(event.user_turn)
            if event.user_turn is None:  # regenerate: the new sibling replaces the last reply
                widgets = chat.turn_widgets
                if widgets and widgets[-1].turn.role == "assistant":
                    await widgets[-1].remove()
            await chat.start_streaming(event.assistant_turn_id, self.latencies)
            chat.anchor()
        elif isinstance(event, TurnFinished):
            job.saw_finish = True
            if chat.at_tail:
                await chat.finish_turn(event.turn)
            if event.turn.status == "cancelled":
                self.say("reply stopped; the partial reply is kept", timeout=3)
        elif isinstance(event, ProgressEvent):
            bar = self.progress
            bar.display = True
            bar.update(total=max(event.total, 1), progress=event.done)
            self.status_bar.show(activity=f"{event.label} {event.done}/{event.total}")
        elif isinstance(event, StatsEvent):
            if self.status_bar.view is not None:
                self.status_bar.show(replace(self.status_bar.view, tokens_folded=event.tokens_folded,
                                             state_bytes=event.state_bytes,
                                             last_tokens_per_s=event.tokens_per_s))
        elif isinstance(event, ErrorEvent):
            job.failed = True
            self.say(event.message, "error", timeout=8)

    async def on_job_ended(self, message: JobEnded) -> None:
        job = self.job
        if job is None or message.job_id != job.id:
            return
        self.job = None
        self.progress.display = False
        stream = self.chat.streaming
        if stream is not None:  # the service ended without TurnFinished (error): keep what came
            await stream.remove()
        if job.kind in ("attach", "rebuild") or (stream is not None and not job.saw_finish):
            await self.load_session()
        else:
            self.mark_held()  # the reply pushed older turns out of the window
            self.refresh_status(activity="")
        if job.kind == "rebuild":
            if job.failed or job.cancel.is_set():
                self.push_screen(RebuildScreen("rebuilding did not finish"), self._on_rebuild_choice)
            else:
                self.say("state rebuilt from the transcript")
        self.status_bar.show(activity="")

    def _on_rebuild_choice(self, rebuild: bool | None) -> None:
        if rebuild:
            self.start_job("rebuild", lambda cancel: self.service.rebuild_state(cancel))
        else:
            self.exit()

    # ---- requests carried out by SessionActions (Textual finds these by name) ---------------

    async def on_prompt_area_submitted(self, message: PromptArea.Submitted) -> None:
        await self.actions.submit(message)

    async def on_message_widget_sibling_requested(self, message: MessageWidget.SiblingRequested) -> None:
        await self.actions.switch_sibling(message)

    async def on_sessions_screen_requested(self, message: SessionsScreen.Requested) -> None:
        await self.actions.sessions_request(message)

    async def action_new_session(self) -> None:
        await self.actions.new_session()

    def action_sessions(self) -> None:
        self.actions.open_sessions()

    def action_help(self) -> None:
        self.actions.show_help()

    # ---- actions -----------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.job is not None and not self.job.cancel.is_set():
            self.job.cancel.set()
            self.status_bar.show(activity="stopping…")
        elif self.focused is not self.prompt:
            self.prompt.focus()

    def action_regenerate(self) -> None:
        self.start_job("regenerate", lambda cancel: self.service.regenerate(cancel))

    def action_copy_message(self) -> None:
        msg = self.chat.focused_message(self.focused)
        if msg is None:
            self.say("nothing to copy yet", "warning")
            return
        self.copy_to_clipboard(msg.turn.content)
        self.say(f"copied the {msg.turn.role} message ({len(msg.turn.content):,} characters)", timeout=2)

    def action_copy_code(self) -> None:
        """Copy the last code block of the message; pressing again walks to earlier blocks."""
        msg = self.chat.focused_message(self.focused)
        blocks = code_blocks(msg.turn.content) if msg is not None else []
        if msg is None or not blocks:
            self.say("no code block in that message", "warning")
            return
        if self._code_cursor is not None and self._code_cursor[0] == msg.turn_id:
            index = (self._code_cursor[1] - 1) % len(blocks)
        else:
            index = len(blocks) - 1
        self._code_cursor = (msg.turn_id, index)
        self.copy_to_clipboard(blocks[index])
        self.say(f"copied code block {index + 1}/{len(blocks)}", timeout=2)

    async def action_quit(self) -> None:
        """Stop a running reply and give the service a moment to store it as cancelled."""
        job = self.job
        if job is not None:
            job.cancel.set()
            await asyncio.to_thread(job.done.wait, QUIT_GRACE_S)
            self.job = None  # events still queued from it must not touch a closing screen
        self.exit()

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.cancel.set()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in self.BINDINGS:
            if isinstance(b, Binding) and b.id and b.id != "quit":
                keys = self.keymap.get(b.id, b.key)
                yield SystemCommand(b.description, f"{keys} · id {b.id}", self._runner(b.action))
        yield from self.actions.slash_system_commands()

    def _runner(self, action: str):  # noqa: ANN202 - a zero-argument callback for the palette
        def run() -> None:
            self.call_later(self.run_action, action)

        return run


def known_bindings() -> dict[str, Binding]:
    """Every remappable binding of the TUI, by id (the app's own come first)."""
    return binding_ids([LaplaceApp.BINDINGS, PromptArea.BINDINGS, SessionsScreen.BINDINGS,
                        MessageWidget.BINDINGS, ConfirmScreen.BINDINGS])


def binding_scopes() -> list[list[str]]:
    """Ids whose bindings can fire at the same time, so must not share a key: the app's with
    the focused prompt's or message's; a screen on top (sessions panel, dialog) with the
    app's priority ones (its own bindings override the app's other keys on purpose)."""
    def ids(bindings: list) -> list[str]:  # type: ignore[type-arg]
        return list(binding_ids([bindings]))

    app = ids(LaplaceApp.BINDINGS)
    priority = [b for b in app if known_bindings()[b].priority]
    return [app + ids(PromptArea.BINDINGS), app + ids(MessageWidget.BINDINGS),
            priority + ids(SessionsScreen.BINDINGS), priority + ids(ConfirmScreen.BINDINGS)]
