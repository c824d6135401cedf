"""Append-only, named schema migrations.

Rules: never edit or reorder a migration that has shipped; add a new function at the end.
Each runs inside the transaction that also records its name in `_migrations`, so a crash
mid-migration leaves the schema at the previous version. They are applied only by
`sessions.database.open_database`, which backs the file up first.

The data model (integer keys everywhere, a separate text `uid` for what users see, so the
FTS index, which is keyed by rowid, survives VACUUM):

- sessions: one conversation; `head_turn_id` is the tip of the current branch.
- turns: a tree (`parent_id`), root = the session's system turn at depth 0. Each turn keeps
  the exact token ids it folded into the state, `tokens_total` and the chained `stream_hash`.
- state_snapshots + snapshot_data: the state after a turn; metadata apart from the BLOB so
  that listing snapshots never reads megabytes.
- probe_runs, finetune_runs: rows other features fill.
- turns_fts: FTS5 over turn content, kept in sync by triggers.
- session_leases: which process may write a session, until when.
"""

from __future__ import annotations

from typing import Callable

from sqlite_utils import Database


def m001_sessions_and_turns(db: Database) -> None:
    db.executescript(
        """
        CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            uid TEXT NOT NULL UNIQUE,
            name TEXT,
            model_id TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            options TEXT NOT NULL DEFAULT '{}',
            head_turn_id INTEGER,
            forked_from_session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL,
            forked_from_turn_id INTEGER,
            archived INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX sessions_updated ON sessions(updated_at);
        CREATE TABLE turns (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES turns(id) ON DELETE CASCADE,
            depth INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'document')),
            content TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL
                CHECK (status IN ('streaming', 'complete', 'cancelled', 'error')),
            token_ids BLOB,
            n_tokens INTEGER NOT NULL DEFAULT 0,
            tokens_total INTEGER NOT NULL DEFAULT 0,
            stream_hash TEXT NOT NULL,
            stats TEXT NOT NULL DEFAULT '{}',
            error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX turns_session_depth ON turns(session_id, depth);
        CREATE INDEX turns_parent ON turns(parent_id);
        CREATE INDEX turns_status ON turns(status) WHERE status = 'streaming';
        """
    )


def m002_state_snapshots(db: Database) -> None:
    db.executescript(
        """
        ALTER TABLE sessions ADD COLUMN keep_snapshots INTEGER NOT NULL DEFAULT 2;
        CREATE TABLE state_snapshots (
            id INTEGER PRIMARY KEY,
            uid TEXT NOT NULL UNIQUE,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_id INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
            n_tokens INTEGER NOT NULL,
            stream_hash TEXT NOT NULL,
            model_fingerprint TEXT NOT NULL,
            format TEXT NOT NULL,
            dtype TEXT NOT NULL,
            byte_size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            extra TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL
        );
        CREATE INDEX state_snapshots_session ON state_snapshots(session_id);
        CREATE INDEX state_snapshots_turn ON state_snapshots(turn_id);
        CREATE TABLE snapshot_data (
            snapshot_id INTEGER PRIMARY KEY REFERENCES state_snapshots(id) ON DELETE CASCADE,
            data BLOB NOT NULL
        );
        """
    )


def m003_probe_and_finetune_runs(db: Database) -> None:
    for table in ("probe_runs", "finetune_runs"):
        db.executescript(
            f"""
            CREATE TABLE {table} (
                id INTEGER PRIMARY KEY,
                uid TEXT NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                model_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                payload TEXT NOT NULL DEFAULT '{{}}',
                session_id INTEGER REFERENCES sessions(id) ON DELETE SET NULL
            );
            CREATE INDEX {table}_created ON {table}(created_at);
            CREATE INDEX {table}_session ON {table}(session_id);
            """
        )


def m004_turns_fts(db: Database) -> None:
    # Hand-written rather than `enable_fts(create_triggers=True)`: we need the index built
    # inside this migration's transaction, and the triggers must skip rewrites that leave the
    # content alone (status flips, stats) so a commit does not rewrite index entries.
    db.executescript(
        """
        CREATE VIRTUAL TABLE turns_fts USING fts5(
            content, content='turns', content_rowid='id', tokenize='porter unicode61'
        );
        INSERT INTO turns_fts(rowid, content) SELECT id, content FROM turns;
        CREATE TRIGGER turns_fts_ai AFTER INSERT ON turns BEGIN
            INSERT INTO turns_fts(rowid, content) VALUES (new.id, new.content);
        END;
        CREATE TRIGGER turns_fts_ad AFTER DELETE ON turns BEGIN
            INSERT INTO turns_fts(turns_fts, rowid, content) VALUES ('delete', old.id, old.content);
        END;
        CREATE TRIGGER turns_fts_au AFTER UPDATE OF content ON turns
        WHEN old.content IS NOT new.content BEGIN
            INSERT INTO turns_fts(turns_fts, rowid, content) VALUES ('delete', old.id, old.content);
            INSERT INTO turns_fts(rowid, content) VALUES (new.id, new.content);
        END;
        """
    )


def m005_session_leases(db: Database) -> None:
    db.executescript(
        """
        CREATE TABLE session_leases (
            session_id INTEGER PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
            owner TEXT NOT NULL,
            pid INTEGER NOT NULL,
            hostname TEXT NOT NULL,
            acquired_at REAL NOT NULL,
            expires_at REAL NOT NULL
        );
        """
    )


def m006_default_model_became_demo(db: Database) -> None:
    # Until this version "default" named the 4.9 M model bundled in the package; that model is
    # now "demo", and "default" is SmolLM2-135M as a hybrid. Sessions made before keep their
    # model (their states were read by it), instead of failing against the new default.
    for table in ("sessions", "probe_runs", "finetune_runs"):
        db.execute(f"UPDATE {table} SET model_id = 'demo' WHERE model_id = 'default'")


Migration = Callable[[Database], None]

# The order is the schema version: version N means the first N have been applied.
MIGRATIONS: tuple[Migration, ...] = (
    m001_sessions_and_turns,
    m002_state_snapshots,
    m003_probe_and_finetune_runs,
    m004_turns_fts,
    m005_session_leases,
    m006_default_model_became_demo,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migration_name(migration: Migration) -> str:
    return migration.__name__


def applied_migrations(db: Database) -> list[str]:
    if "_migrations" not in db.table_names():
        return []
    return [row[0] for row in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def pending_migrations(db: Database, upto: int | None = None) -> list[Migration]:
    done = set(applied_migrations(db))
    return [m for m in MIGRATIONS[:upto] if migration_name(m) not in done]


def apply_migrations(db: Database, clock: Callable[[], str], upto: int | None = None) -> list[str]:
    """Apply pending migrations (the first `upto` only, for tests); return the names applied.

    Each migration gets its own BEGIN IMMEDIATE, and re-checks inside it, so two processes
    opening an old database at once apply each migration exactly once.
    """
    applied: list[str] = []
    db.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    for migration in MIGRATIONS[:upto]:
        name = migration_name(migration)
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", [name]).fetchone():
                db.conn.execute("ROLLBACK")
                continue
            migration(db)
            db.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", [name, clock()])
            db.conn.execute("COMMIT")
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied
