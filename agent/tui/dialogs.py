"""Small modal screens: yes/no confirmation, one-line text input, the unusable-state
choice shown at startup, and the help page."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown

from agent.display import displayable


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only on the confirm button."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel", id="dialog_cancel")]

    def __init__(self, question: str, *, confirm: str = "Delete", cancel: str = "Cancel") -> None:
        super().__init__(classes="dialog-screen")
        self.question = question
        self.confirm_label = confirm
        self.cancel_label = cancel

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(displayable(self.question), classes="dialog-question", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.confirm_label, variant="error", id="confirm")
                yield Button(self.cancel_label, id="cancel")

    def on_mount(self) -> None:
        # Focus the harmless choice: Enter right after the dialog opens must not delete.
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")


class TextInputScreen(ModalScreen["str | None"]):
    """Ask for one line of text (e.g. a new session name); None when cancelled."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="dialog_cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(displayable(self.title_text), classes="dialog-question", markup=False)
            yield Input(self.value, id="dialog-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)


class RebuildScreen(ModalScreen[bool]):
    """The stored state can't be used: rebuild it by replaying the transcript, or quit."""

    BINDINGS = [Binding("escape", "dismiss(False)", "Quit", id="dialog_cancel")]

    def __init__(self, reason: str) -> None:
        super().__init__(classes="dialog-screen")
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(
                displayable(f"The stored state can't be used: {self.reason}.\n"
                            "Rebuild it by replaying the transcript?"),
                classes="dialog-question", markup=False,
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Rebuild", variant="primary", id="rebuild")
                yield Button("Quit", id="quit")

    def on_mount(self) -> None:
        self.query_one("#rebuild", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "rebuild")


class HelpScreen(ModalScreen[None]):
    """Slash commands and the current key bindings, as Markdown."""

    BINDINGS = [Binding("escape,q,f1", "dismiss(None)", "Close", id="dialog_cancel")]

    def __init__(self, markdown: str) -> None:
        super().__init__(classes="dialog-screen")
        self.markdown = markdown

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Markdown(self.markdown)
