"""`laplace chat --keymap`: a bad keymap is one error line before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.cli.chat import load_keymap
from agent.settings import Settings
from agent.tui.factory import known_binding_ids
from agent.tui.keymap import validate_keymap

runner = CliRunner()


def chat_with(keymap: Path):
    # -m names a model that does not exist: reaching the model would be a different error.
    return runner.invoke(app, ["chat", "-m", "no-such-model", "--keymap", str(keymap)])


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "does not exist; check the --keymap path"),
        ("[keys]\nregenerate = \"ctlr+r\"\n", "'ctlr+r' is not a valid key: unknown modifier 'ctlr'"),
        ("[keys]\nregenerate = \"f99\"\n", "unknown key name 'f99'"),
        ("[keys]\nregenerate = \"f5,,ctrl+r\"\n", "an empty key between commas"),
        ("[keys]\nregenerate = [5, true]\n", "or a list of such strings; got [5, True]"),
        ("[keys]\nregenerate = []\n", "or a list of such strings; got []"),
        ("[keys]\nregenerate = [\"f5\", \"bogus_key\"]\n", "unknown key name 'bogus_key'"),
        ("regenerate = \"f5\"\n", "unexpected 'regenerate' outside [keys]"),
        ("[keys]\nregen = \"f5\"\n", "unknown key binding id 'regen'"),
        ("[keys\n", "not valid TOML"),
        ("[keys]\nquit = \"enter\"\n", "'quit' and 'submit' would both take 'enter'"),
        ("[keys]\nregenerate = \"ctrl+o\"\n", "'regenerate' and 'sessions' would both take 'ctrl+o'"),
        ("[keys]\nnewline = \"ctrl+t\"\n", "'newline' and 'copy_message' would both take 'ctrl+t'"),
        ("[keys]\nsessions_new = \"ctrl+q\"\n", "'sessions_new' and 'quit' would both take 'ctrl+q'"),
        ("[keys]\nmessage_next = \"f1\"\n", "'message_next' and 'help' would both take 'f1'"),
        ("[keys]\ncopy_code = \"f5\"\ncopy_message = \"f5\"\n", "'copy_code' and 'copy_message' would both take 'f5'"),
    ],
    ids=["missing-file", "bad-modifier", "bad-key", "empty-key", "list-of-non-strings", "empty-list", "bad-key-in-list",
         "outside-table", "unknown-id", "bad-toml", "quit-on-enter", "app-with-app", "prompt-with-app", "panel-with-quit",
         "message-with-app", "two-remapped"],
)
def test_bad_keymap_is_one_error_line(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "keys.toml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    res = chat_with(path)
    assert res.exit_code == 1, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert match in res.stderr and "Traceback" not in res.output
    assert "no-such-model" not in res.stderr  # refused before the model was looked up


def test_good_keymaps_load(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('[keys]\nregenerate = "f5, ctrl+shift+r"\nnewline = ["ctrl+j", "alt+enter"]\nsubmit = "question_mark"\n')
    home = Settings.from_env().home
    assert load_keymap(path, home) == {"regenerate": "f5,ctrl+shift+r", "newline": "ctrl+j,alt+enter", "submit": "question_mark"}
    assert load_keymap(None, home) is None  # the default file is optional
    Settings.from_env().ensure_home()
    (Settings.from_env().home / "keymap.toml").write_text('[keys]\nregenerate = "f6"\n')
    assert load_keymap(None, home) == {"regenerate": "f6"}


def test_keys_may_repeat_where_the_bindings_are_never_active_together(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    # The prompt's enter and a focused message's enter never compete; the sessions panel
    # overrides the app's own (non-priority) keys on purpose; a freed key can be reused.
    path.write_text('[keys]\ntoggle_recall = "enter"\nsessions_rename = "ctrl+t"\nregenerate = "f5"\ncopy_message = "ctrl+r"\n')
    assert load_keymap(path, Settings.from_env().home) is not None


def test_every_default_binding_key_is_valid() -> None:
    from agent.tui.app import known_bindings

    defaults = {bid: b.key for bid, b in known_bindings().items()}
    assert validate_keymap(defaults, known_binding_ids()) == {k: ",".join(p.strip() for p in v.split(",")) for k, v in defaults.items()}
