"""Slash commands typed in the prompt: a pure parser, tested without the UI.

`parse_slash(text)` returns None for an ordinary message, a command dataclass for a slash
command, and raises `SlashError` (one line: what is wrong and the usage) for a malformed one.
A message that really starts with a slash is typed with two: `//etc/hosts is...` sends
`/etc/hosts is...` (see `unescape_message`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union


class SlashError(ValueError):
    """A malformed slash command; the message says what is wrong and how to type it."""


@dataclass(frozen=True)
class NewCmd:
    name: str | None = None


@dataclass(frozen=True)
class ForkCmd:
    pass


@dataclass(frozen=True)
class RenameCmd:
    name: str


@dataclass(frozen=True)
class SystemCmd:
    text: str


@dataclass(frozen=True)
class AttachCmd:
    path: Path


@dataclass(frozen=True)
class ExportCmd:
    fmt: Literal["markdown", "json"]
    path: Path | None


@dataclass(frozen=True)
class ProbeCmd:
    question: str
    expected: str | None


@dataclass(frozen=True)
class SetCmd:
    key: str
    value: str


@dataclass(frozen=True)
class HelpCmd:
    pass


SlashCommand = Union[NewCmd, ForkCmd, RenameCmd, SystemCmd, AttachCmd, ExportCmd, ProbeCmd, SetCmd, HelpCmd]

# name -> (usage, one-line description); the order is the order /help shows.
COMMANDS: dict[str, tuple[str, str]] = {
    "new": ("/new [NAME]", "start a new session"),
    "fork": ("/fork", "copy this session (cheap: the state is copied, not replayed) and switch to it"),
    "rename": ("/rename NAME", "rename this session"),
    "system": ("/system TEXT", "start a new session with this system prompt (the old one is kept)"),
    "attach": ("/attach FILE", "fold a document into the state, with a progress bar"),
    "export": ("/export [md|json] [PATH]", "write the transcript as Markdown (default) or JSON"),
    "probe": ("/probe QUESTION => EXPECTED", "ask whether the state still remembers something"),
    "set": ("/set KEY VALUE", "set a sampling option, e.g. /set temperature 0.7"),
    "help": ("/help", "show commands and keys"),
}

_FORMATS: dict[str, Literal["markdown", "json"]] = {"md": "markdown", "markdown": "markdown", "json": "json"}


def is_slash(text: str) -> bool:
    """True when `text` is a slash command (not an escaped `//` message)."""
    stripped = text.lstrip()
    return stripped.startswith("/") and not stripped.startswith("//")


def unescape_message(text: str) -> str:
    """An ordinary message as it should be sent: a leading `//` stands for one `/`."""
    stripped = text.lstrip()
    if stripped.startswith("//"):
        return stripped[1:]
    return text


def _usage(name: str) -> str:
    return f"usage: {COMMANDS[name][0]}"


def _strip_quotes(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _path(value: str) -> Path:
    return Path(_strip_quotes(value.strip())).expanduser()


def parse_slash(text: str) -> SlashCommand | None:
    """Parse one prompt submission. None means "send it as a message"."""
    if not is_slash(text):
        return None
    body = text.strip()[1:]
    name, _, rest = body.partition(" ")
    if "\n" in name:  # "/new\nsomething": the command word ends at the first whitespace
        name, _, more = name.partition("\n")
        rest = more + " " + rest
    name = name.lower()
    rest = rest.strip()
    if name not in COMMANDS:
        known = ", ".join("/" + n for n in COMMANDS)
        raise SlashError(f"unknown command /{name}; known: {known} (start with // to send a literal slash)")

    if name == "new":
        return NewCmd(name=rest or None)
    if name == "fork":
        if rest:
            raise SlashError(f"/fork takes no arguments; {_usage(name)}")
        return ForkCmd()
    if name == "help":
        return HelpCmd()
    if name == "rename":
        if not rest:
            raise SlashError(f"/rename needs a name; {_usage(name)}")
        return RenameCmd(name=_strip_quotes(rest))
    if name == "system":
        if not rest:
            raise SlashError(f"/system needs the prompt text; {_usage(name)}")
        return SystemCmd(text=rest)
    if name == "attach":
        if not rest:
            raise SlashError(f"/attach needs a file; {_usage(name)}")
        return AttachCmd(path=_path(rest))
    if name == "export":
        return _parse_export(rest)
    if name == "probe":
        question, sep, expected = rest.partition("=>")
        question, expected = question.strip(), expected.strip()
        if not question:
            raise SlashError(f"/probe needs a question; {_usage(name)}")
        if sep and not expected:
            raise SlashError(f"/probe: nothing after '=>'; {_usage(name)}")
        return ProbeCmd(question=question, expected=expected or None)
    if name == "set":
        key, _, value = rest.partition(" ")
        if not key or not value.strip():
            raise SlashError(f"/set needs a key and a value; {_usage(name)}")
        return SetCmd(key=key, value=value.strip())
    raise AssertionError(f"command /{name} is listed but not parsed")  # pragma: no cover


def _parse_export(rest: str) -> ExportCmd:
    first, _, remainder = rest.partition(" ")
    if first.lower() in _FORMATS:
        fmt = _FORMATS[first.lower()]
        path = _path(remainder) if remainder.strip() else None
        return ExportCmd(fmt=fmt, path=path)
    if not rest:
        return ExportCmd(fmt="markdown", path=None)
    path = _path(rest)
    # "/export notes.json" means JSON: the suffix is an unambiguous request for the format.
    fmt: Literal["markdown", "json"] = "json" if path.suffix.lower() == ".json" else "markdown"
    return ExportCmd(fmt=fmt, path=path)


def help_markdown() -> str:
    """The /help text for slash commands, as Markdown."""
    lines = ["| command | what it does |", "| --- | --- |"]
    lines += [f"| `{usage}` | {desc} |" for usage, desc in COMMANDS.values()]
    lines.append("")
    lines.append("Start a message with `//` to send a literal leading slash.")
    return "\n".join(lines)
