"""The slash-command parser, without the UI."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.tui.slash import (
    COMMANDS,
    AttachCmd,
    ExportCmd,
    ForkCmd,
    HelpCmd,
    NewCmd,
    ProbeCmd,
    RenameCmd,
    SetCmd,
    SlashError,
    SystemCmd,
    help_markdown,
    is_slash,
    parse_slash,
    unescape_message,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("/new", NewCmd()),
        ("/new  research log ", NewCmd("research log")),
        ("/fork", ForkCmd()),
        ("  /FORK  ", ForkCmd()),
        ("/rename my notes", RenameCmd("my notes")),
        ('/rename "quoted name"', RenameCmd("quoted name")),
        ("/system You are terse.\nAnswer in French.", SystemCmd("You are terse.\nAnswer in French.")),
        ("/attach notes.txt", AttachCmd(Path("notes.txt"))),
        ("/attach 'my file.txt'", AttachCmd(Path("my file.txt"))),
        ("/attach ~/doc.md", AttachCmd(Path("~/doc.md").expanduser())),
        ("/export", ExportCmd("markdown", None)),
        ("/export md", ExportCmd("markdown", None)),
        ("/export json", ExportCmd("json", None)),
        ("/export json out/s.json", ExportCmd("json", Path("out/s.json"))),
        ("/export markdown a b.md", ExportCmd("markdown", Path("a b.md"))),
        ("/export notes.json", ExportCmd("json", Path("notes.json"))),
        ("/export notes.txt", ExportCmd("markdown", Path("notes.txt"))),
        ("/probe what is my cat's name? => Tom", ProbeCmd("what is my cat's name?", "Tom")),
        ("/probe where do I live?", ProbeCmd("where do I live?", None)),
        ("/probe a => b => c", ProbeCmd("a", "b => c")),
        ("/set temperature 0.7", SetCmd("temperature", "0.7")),
        ("/help", HelpCmd()),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_parses(text: str, expected: object) -> None:
    assert parse_slash(text) == expected


@pytest.mark.parametrize("text", ["hello", "", "  ", "what about a/b?", "//etc/hosts is odd"])
def test_ordinary_messages_are_not_commands(text: str) -> None:
    assert parse_slash(text) is None


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("/nope", "unknown command /nope"),
        ("/rename", "/rename NAME"),
        ("/system   ", "/system TEXT"),
        ("/attach", "/attach FILE"),
        ("/fork now", "takes no arguments"),
        ("/probe => x", "needs a question"),
        ("/probe q =>", "nothing after"),
        ("/set temperature", "/set KEY VALUE"),
    ],
)
def test_errors_name_the_usage(text: str, fragment: str) -> None:
    with pytest.raises(SlashError, match=None) as info:
        parse_slash(text)
    assert fragment in str(info.value)


def test_double_slash_sends_a_literal_slash() -> None:
    assert not is_slash("//tmp is full")
    assert unescape_message("//tmp is full") == "/tmp is full"
    assert unescape_message("plain") == "plain"


def test_help_lists_every_command() -> None:
    text = help_markdown()
    for usage, _ in COMMANDS.values():
        assert usage in text
