"""The settings, the data directory and the session database as every command opens them.

One place turns the ways LAPLACE_HOME can be unusable (a file, under a file, not creatable,
read-only, a laplace.db that is not a database) into one `error:` line that names the cause
and the fix, and warns when the directory is open to other users. Imports no torch.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import typer

from agent.cli.errors import fail
from agent.settings import Settings
from sessions import SessionError, SessionStore


def settings_of(ctx: typer.Context) -> Settings:
    """The settings `laplace` read from the environment once, before any command ran (the
    root callback in agent/cli/__init__.py); commands pass them down from here."""
    settings = ctx.obj
    if not isinstance(settings, Settings):
        raise RuntimeError("laplace commands run under agent.cli.app, whose callback reads the settings")
    return settings


def _first_file_above(path: Path) -> Path | None:
    for parent in (path, *path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def prepare_home(settings: Settings) -> Path:
    """Create LAPLACE_HOME (0700) or fail with one line; warn if it is open to others."""
    home = settings.home
    try:
        settings.ensure_home()
    except OSError as exc:
        blocker = _first_file_above(home)
        if blocker == home:
            raise fail(f"the data directory {home} is a file; move it aside or set LAPLACE_HOME to a directory") from None
        if blocker is not None:
            raise fail(f"cannot create the data directory {home}: {blocker} is a file; set LAPLACE_HOME to a directory path") from None
        raise fail(f"cannot create the data directory {home} ({exc.strerror or exc}); set LAPLACE_HOME to a writable directory") from None
    mode = settings.exposed_mode()
    if mode is not None:
        typer.echo(f"warning: the data directory {home} is open to other users (mode {mode:04o}); "
                   f"run `chmod 700 {home}` to make it private", err=True)
    return home


def database_error(path: Path, exc: BaseException) -> typer.Exit:
    """One line for a database that SQLite or the OS refuses, with what to do about it."""
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return fail(f"{path} is not a usable laplace database ({text}); move it aside to start fresh")
    if "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        return fail(f"the session database {path} is read-only ({text}); make it and {path.parent} writable (chmod u+w)")
    if "unable to open" in text:
        return fail(f"cannot open the session database {path} ({text}); make {path.parent} writable or set LAPLACE_HOME elsewhere")
    return fail(f"cannot use the session database {path} ({text}); move it aside to start fresh")


def open_store(settings: Settings) -> SessionStore:
    """The session store under LAPLACE_HOME, created and migrated; typer.Exit on failure."""
    prepare_home(settings)
    try:
        return SessionStore.open(settings.db_path)
    except SessionError as exc:
        raise fail(str(exc)) from None
    except (sqlite3.Error, OSError) as exc:
        raise database_error(settings.db_path, exc) from None


@contextmanager
def session_store(settings: Settings) -> Iterator[SessionStore]:
    """`open_store` as a context manager; errors raised while using the store become one line too."""
    store = open_store(settings)
    try:
        with store:
            yield store
    except SessionError as exc:
        raise fail(str(exc)) from None
    except sqlite3.Error as exc:
        raise database_error(settings.db_path, exc) from None
