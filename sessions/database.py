"""Opening the database file: permissions, pragmas, backup, migrations. The one place.

Private by default: the file is created 0600 before SQLite touches it (SQLite gives the
-wal and -shm files the database file's mode), inside a 0700 directory. WAL lets readers
run while a writer commits; `synchronous=FULL` makes a returned commit survive power loss,
not only a killed process. `secure_delete=FAST` zeroes deleted rows where that costs no
extra I/O (halving the commit time of a 29.5 MB state against ON, which also zeroes every
pruned snapshot); deleting a session switches to full zeroing (see `delete_session`).
A file that is another program's SQLite database (tables, but no `_migrations`) is refused
before anything touches it: no chmod, no WAL header, no backup, no laplace tables.
"""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote
from datetime import datetime, timezone
from pathlib import Path

from sqlite_utils import Database

from .errors import ForeignDatabase, SchemaTooOld
from .migrations import SCHEMA_VERSION, apply_migrations, applied_migrations, migration_name, pending_migrations

BUSY_TIMEOUT_MS = 10_000


def utcnow() -> str:
    """Timestamps as fixed-width ISO-8601 UTC strings, so they sort as text."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _create_private(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        pass
    # The umask can only remove bits, but an existing file may have been created loosely.
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o600)


def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves; Python's implicit transactions
    # would otherwise wrap reads and hold snapshots open. check_same_thread=False: the chat
    # service is driven from a UI worker thread; it serializes its own calls with a lock.
    if readonly:
        conn = sqlite3.connect(
            f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None,
            timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False,
        )
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                               check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = FAST")
    return conn


def _backup(db: Database, path: Path, version: int) -> Path:
    target = path.with_name(f"{path.name}.bak-{version}")
    fd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    os.close(fd)
    dest = sqlite3.connect(str(target))
    try:
        db.conn.backup(dest)  # a consistent copy even while other readers are active
    finally:
        dest.close()
    os.chmod(target, 0o600)
    return target


def _refuse_foreign(path: Path) -> None:
    """Raise ForeignDatabase if `path` holds tables but not laplace's. Read through a
    read-only connection before anything touches the file (mode, WAL header, backup,
    migrations); an empty file or a laplace database passes."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    finally:
        conn.close()
    if tables and "_migrations" not in tables:
        raise ForeignDatabase(path, tables)


def open_database(path: Path, *, readonly: bool = False, upto: int | None = None) -> Database:
    """Open (creating if needed) and migrate the database; `upto` stops early, for tests.
    A database of another program (tables, none of them laplace's) is refused untouched."""
    path = Path(path)
    _refuse_foreign(path)
    if readonly:
        if not path.exists():
            raise FileNotFoundError(f"no database at {path}")
        db = Database(_connect(path, readonly=True))
        pending = pending_migrations(db, upto)
        if pending:
            db.close()
            raise SchemaTooOld(path, [migration_name(m) for m in pending])
        return db
    _create_private(path)
    db = Database(_connect(path, readonly=False))
    try:
        if pending_migrations(db, upto):
            # Back up only a database that holds something: a fresh file has nothing to lose.
            if db.table_names():
                _backup(db, path, len(applied_migrations(db)))
            apply_migrations(db, utcnow, upto)
    except BaseException:
        db.close()
        raise
    return db


def schema_version(db: Database) -> int:
    return len(applied_migrations(db))


__all__ = ["open_database", "schema_version", "utcnow", "SCHEMA_VERSION"]
