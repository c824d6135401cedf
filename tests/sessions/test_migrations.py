"""Migrations: from a blank database and from every earlier schema version, with a backup."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sessions import SchemaTooOld, SessionStore
from sessions.database import open_database, schema_version
from sessions.migrations import MIGRATIONS, SCHEMA_VERSION, applied_migrations, migration_name

from .conftest import FINGERPRINT, converse


def test_blank_database_gets_every_migration_and_no_backup(db_path: Path) -> None:
    with SessionStore.open(db_path) as store:
        assert applied_migrations(store.db) == [migration_name(m) for m in MIGRATIONS]
        assert schema_version(store.db) == SCHEMA_VERSION
    assert list(db_path.parent.glob("*.bak-*")) == []
    # Reopening applies nothing twice.
    with SessionStore.open(db_path) as store:
        assert len(applied_migrations(store.db)) == SCHEMA_VERSION


def _seed_old_schema(db_path: Path, version: int) -> None:
    """A database left at `version` by an older laplace, holding one conversation."""
    db = open_database(db_path, upto=version)
    if version >= 1:
        h = "0" * 64
        db.execute("INSERT INTO sessions (uid, name, model_id, created_at, updated_at)"
                   " VALUES ('ab12cd', 'old', 'tiny', '2025-01-01', '2025-01-01')")
        db.execute("INSERT INTO turns (session_id, depth, role, content, status, stream_hash,"
                   " created_at, updated_at) VALUES (1, 0, 'system', '', 'complete', ?, 'x', 'x')", [h])
        db.execute("INSERT INTO turns (session_id, parent_id, depth, role, content, status, stream_hash,"
                   " created_at, updated_at) VALUES (1, 1, 1, 'user', 'ancient aardvark', 'complete', ?,"
                   " 'x', 'x')", [h])
        db.execute("UPDATE sessions SET head_turn_id = 2")
    db.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION), ids=lambda v: f"from_v{v}")
def test_upgrade_from_every_earlier_version(db_path: Path, version: int) -> None:
    _seed_old_schema(db_path, version)
    with SessionStore.open(db_path) as store:
        assert schema_version(store.db) == SCHEMA_VERSION
        s = store.core.get_session("ab12")
        assert s.keep_snapshots == 2 and [t.content for t in store.tree.tail(s.id)] == ["", "ancient aardvark"]
        assert store.browse.search("aardvark")[0].turn_id == 2  # FTS built over pre-existing rows
        converse(store, s.id, "new turn after upgrade")
        assert store.states.resume(s.id, expected_fingerprint=FINGERPRINT).snapshot is not None
    backup = db_path.with_name(f"{db_path.name}.bak-{version}")
    assert backup.exists() and backup.stat().st_mode & 0o777 == 0o600
    old = sqlite3.connect(backup)
    assert old.execute("SELECT count(*) FROM _migrations").fetchone()[0] == version
    assert old.execute("SELECT content FROM turns WHERE id = 2").fetchone()[0] == "ancient aardvark"
    old.close()


def test_readonly_open_refuses_an_unmigrated_database(db_path: Path) -> None:
    _seed_old_schema(db_path, 2)
    with pytest.raises(SchemaTooOld, match="read-only"):
        SessionStore.open(db_path, readonly=True)


def test_failed_migration_rolls_back_and_is_retried(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed_old_schema(db_path, 2)
    import sessions.migrations as mig

    def broken(db) -> None:
        db.execute("CREATE TABLE probe_runs (id INTEGER PRIMARY KEY)")
        raise RuntimeError("disk on fire")

    broken.__name__ = "m003_probe_and_finetune_runs"
    monkeypatch.setattr(mig, "MIGRATIONS", (*mig.MIGRATIONS[:2], broken, *mig.MIGRATIONS[3:]))
    with pytest.raises(RuntimeError):
        open_database(db_path)
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM _migrations").fetchone()[0] == 2
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'probe_runs'").fetchone()[0] == 0
    conn.close()
    monkeypatch.undo()
    with SessionStore.open(db_path) as store:
        assert schema_version(store.db) == SCHEMA_VERSION
        assert store.core.get_session("ab12").name == "old"
