"""`SessionStore`: every SQL statement about sessions lives behind this object.

The store is made of parts, each in its own file and each given only the parts it needs:

- `core` (`store_core.py`): the connection, transactions, session lookup;
- `leases` (`store_leases.py`): one writer per session;
- `tree` (`store_tree.py`): reading turns and branches;
- `states` (`store_state.py`): storing, retaining, verifying and resuming states;
- `turns` (`store_turns.py`): creating sessions, appending and committing turns;
- `chain` (`store_chain.py`): hash-chain check and repair;
- `browse` (`store_browse.py`): listing, fork, delete, search, run records, export.

Callers reach the parts through the store (`store.tree.get_turn(id)`,
`store.turns.commit_turn(...)`, `store.states.latest(session)`), so each operation is defined
once, in its part; the store itself only opens, wires and closes them. Every write takes
its transaction inside the part; `store.core.transaction()` groups several into one. The
data model is described in `sessions/migrations.py`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from sqlite_utils import Database

from .database import open_database
from .store_browse import Browse
from .store_chain import Chain
from .store_core import SessionRef, StoreCore
from .store_leases import Leases
from .store_state import Snapshots
from .store_tree import Tree
from .store_turns import DEFAULT_KEEP_SNAPSHOTS, Turns

__all__ = ["DEFAULT_KEEP_SNAPSHOTS", "SessionRef", "SessionStore"]


class SessionStore:
    """Sessions, their turn trees, state snapshots, leases and search, in one SQLite file."""

    def __init__(
        self,
        db: Database,
        *,
        path: Path | None = None,
        readonly: bool = False,
        lease_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = StoreCore(db, path=path, readonly=readonly, clock=clock)
        self.leases = Leases(self.core, ttl_s=lease_ttl_s)
        self.tree = Tree(self.core)
        self.states = Snapshots(self.core, self.leases, self.tree)
        self.turns = Turns(self.core, self.leases, self.tree, self.states)
        self.chain = Chain(self.core, self.leases)
        self.browse = Browse(self.core, self.leases, self.tree, self.states)

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        readonly: bool = False,
        lease_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> "SessionStore":
        """Open the database at `path`, creating and migrating it unless `readonly`."""
        db = open_database(Path(path), readonly=readonly)
        return cls(db, path=Path(path), readonly=readonly, lease_ttl_s=lease_ttl_s, clock=clock)

    @property
    def db(self) -> Database:
        """The connection (migrations and tests read it; everything else goes through a part)."""
        return self.core.db

    def close(self) -> None:
        self.leases.release_all()
        self.core.db.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
