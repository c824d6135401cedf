"""`laplace sessions ...` against hostile input: an unusable data directory or database,
and stored text that holds rich markup or terminal escape sequences."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.cli import sessions as cli_sessions
from agent.settings import Settings
from sessions import SessionStore

from .conftest import converse, tokens_of

runner = CliRunner()
COMMANDS = [["list"], ["show", "abc"], ["search", "fox"]]
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\x9d")


def run(*args: str):
    return runner.invoke(app, ["sessions", *args])


def assert_one_error_line(res, *words: str) -> None:
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_home_is_a_file(cmd: list[str], laplace_home: Path) -> None:
    laplace_home.parent.mkdir(parents=True, exist_ok=True)
    laplace_home.write_text("x")
    assert_one_error_line(run(*cmd), "is a file", "LAPLACE_HOME")


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_home_under_a_file(cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plain").write_text("x")
    monkeypatch.setenv("LAPLACE_HOME", str(tmp_path / "plain" / "home"))
    assert_one_error_line(run(*cmd), "plain is a file", "LAPLACE_HOME")


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_database_that_is_not_a_database(cmd: list[str], laplace_home: Path) -> None:
    laplace_home.mkdir(mode=0o700)
    (laplace_home / "laplace.db").write_bytes(b"this is not sqlite" * 100)
    assert_one_error_line(run(*cmd), "not a usable laplace database", "move it aside")


def _foreign_db(path: Path) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('mine')")
    conn.commit()
    conn.close()
    os.chmod(path, 0o644)
    return path.read_bytes()


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_a_foreign_sqlite_database_is_refused_and_left_as_it_was(cmd: list[str], laplace_home: Path) -> None:
    laplace_home.mkdir(mode=0o700)
    db = laplace_home / "laplace.db"
    before = _foreign_db(db)
    assert_one_error_line(run(*cmd), str(db), "another program", "notes", "move it aside")
    assert db.read_bytes() == before and db.stat().st_mode & 0o777 == 0o644  # not a byte or a bit changed
    assert sorted(p.name for p in laplace_home.iterdir()) == ["laplace.db"]  # no -wal, no backup
    with pytest.raises(Exception, match="another program"):
        SessionStore.open(db, readonly=True)


def test_an_empty_file_or_a_laplace_database_is_fine(laplace_home: Path) -> None:
    laplace_home.mkdir(mode=0o700)
    (laplace_home / "laplace.db").write_bytes(b"")
    assert run("list").exit_code == 0
    assert run("list").exit_code == 0  # and again, now that it is laplace's


@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_an_empty_laplace_home_is_an_error_not_the_default(value: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a blank value must not become a directory named "  " here either
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # where the default would be
    monkeypatch.setenv("LAPLACE_HOME", value)
    assert_one_error_line(run("list"), "LAPLACE_HOME is set but empty", "unset it", str(tmp_path / "xdg"))
    assert_one_error_line(runner.invoke(app, ["ask", "-m", "tiny", "hi"]), "LAPLACE_HOME is set but empty")
    assert list(tmp_path.iterdir()) == []  # neither the default home nor a directory named "  "


def test_home_not_creatable(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, *a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)  # root ignores modes, so refuse the syscall
    assert_one_error_line(run("list"), "cannot create the data directory", "writable")


def test_read_only_database(monkeypatch: pytest.MonkeyPatch) -> None:
    def readonly(*a: object, **k: object) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(SessionStore, "open", readonly)
    assert_one_error_line(run("list"), "read-only", "writable")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any mode")
@pytest.mark.parametrize("where", ["parent", "home"])
def test_real_permission_denied(where: str, laplace_home: Path) -> None:
    if where == "parent":
        laplace_home.parent.chmod(0o500)
    else:
        laplace_home.mkdir(mode=0o500)
    try:
        res = run("list")
    finally:
        laplace_home.parent.chmod(0o700)
    assert_one_error_line(res)


def test_created_directories_are_private_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "a" / "b" / "home"
    monkeypatch.setenv("LAPLACE_HOME", str(home))
    old = os.umask(0)
    try:
        res = run("list")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    for d in (tmp_path / "a", tmp_path / "a" / "b", home):
        assert d.stat().st_mode & 0o777 == 0o700, d
    assert "warning" not in res.stderr


def test_existing_open_home_is_kept_but_warned_about(laplace_home: Path) -> None:
    laplace_home.mkdir()
    laplace_home.chmod(0o755)
    res = run("list")
    assert res.exit_code == 0
    assert "open to other users (mode 0755)" in res.stderr and f"chmod 700 {laplace_home}" in res.stderr
    assert laplace_home.stat().st_mode & 0o777 == 0o755  # not ours to change


EVIL_NAME = "evil [/] \x1b]52;c;SGVsbG8=\x07 \x9b31m"
EVIL_TEXT = "text [/] with [bold]markup[/bold] \x1b[2J and \x9b2J fox \x9d0;title\x9c"


@pytest.fixture
def evil_session() -> str:
    with SessionStore.open(Settings.from_env().db_path) as store:
        s = store.turns.create_session(model_id="tiny\x1b[2J", system_token_ids=tokens_of("s"), name=EVIL_NAME)
        converse(store, s.id, EVIL_TEXT, reply="re \x1b]52;c;QQ==\x07 [/]")
        return s.uid


@pytest.mark.parametrize("cmd", [["list"], ["show", "UID"], ["search", "fox"], ["rm", "UID", "--yes"],
                                 ["export", "UID"]], ids=lambda c: c[0])
def test_stored_text_is_printed_as_text_without_raw_controls(cmd: list[str], evil_session: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_sessions, "_stdout_is_terminal", lambda: True)  # export: pipes get exact bytes
    res = run(*[evil_session if a == "UID" else a for a in cmd])
    assert res.exit_code == 0, res.output
    assert res.exception is None
    for c in RAW_CONTROLS:
        assert c not in res.output
    if cmd[0] in ("show", "search"):
        assert "text [/] with [bold]markup[/bold] ␛[2J" in res.output  # literal, not styled
    if cmd[0] in ("list", "show"):
        assert "evil [/] ␛]52;c;SGVsbG8=␇" in res.output


@pytest.mark.parametrize("cmd", [["list", "--json"], ["show", "UID", "--json"], ["search", "fox", "--json"],
                                 ["export", "UID", "--format", "json"]], ids=lambda c: c[0])
def test_json_output_escapes_controls_and_keeps_the_data(cmd: list[str], evil_session: str) -> None:
    res = run(*[evil_session if a == "UID" else a for a in cmd])
    assert res.exit_code == 0, res.output
    for c in RAW_CONTROLS:
        assert c not in res.output
    found = set(_strings(json.loads(res.output)))
    assert EVIL_NAME in found or EVIL_TEXT in found  # exact, once decoded


def _strings(data: object) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        data = list(data.values())
    return [s for item in data for s in _strings(item)] if isinstance(data, list) else []


def test_markdown_export_to_a_pipe_is_exact(evil_session: str) -> None:
    res = run("export", evil_session)
    assert res.exit_code == 0 and EVIL_TEXT in res.output


@pytest.mark.parametrize("setup, words", [
    ("file", ("is a file", "LAPLACE_HOME")),
    ("not-a-db", ("not a usable laplace database", "move it aside")),
], ids=["home-is-a-file", "not-a-database"])
def test_ask_shares_the_same_errors(setup: str, words: tuple[str, ...], laplace_home: Path) -> None:

    if setup == "file":
        laplace_home.parent.mkdir(parents=True, exist_ok=True)
        laplace_home.write_text("x")
    else:
        laplace_home.mkdir(mode=0o700)
        (laplace_home / "laplace.db").write_bytes(b"junk" * 300)
    assert_one_error_line(runner.invoke(app, ["ask", "-m", "tiny", "hi"]), *words)
