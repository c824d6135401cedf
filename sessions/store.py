"""`SessionStore`: every SQL statement about sessions lives behind this object.

The store is made of parts, each in its own file and each given only the parts it needs:

- `core` (`store_core.py`): the connection, transactions, session lookup;
- `leases` (`store_leases.py`): one writer per session;
- `tree` (`store_tree.py`): reading turns and branches;
- `states` (`store_state.py`): storing, retaining, verifying and resuming states;
- `turns` (`store_turns.py`): creating sessions, appending and committing turns;
- `chain` (`store_chain.py`): hash-chain check and repair;
- `browse` (`store_browse.py`): listing, fork, delete, search, run records, export.

The methods below only delegate, so callers use one object and never a part directly.
The data model is described in `sessions/migrations.py`.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from sqlite_utils import Database

from .database import open_database
from .records import LeaseInfo, Resumed, RunRecord, SearchHit, Session, SessionSummary, Snapshot, StateMeta, Turn
from .store_browse import Browse
from .store_chain import Chain
from .store_core import SessionRef, StoreCore
from .store_leases import Lease, Leases
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
        return self.core.db

    @property
    def path(self) -> Path | None:
        return self.core.path

    @property
    def readonly(self) -> bool:
        return self.core.readonly

    @property
    def lease_ttl_s(self) -> float:
        return self.leases.ttl_s

    def close(self) -> None:
        self.leases.release_all()
        self.core.db.close()

    def __enter__(self) -> "SessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> AbstractContextManager[None]:
        """Group writes into one transaction (e.g. a bulk import); nests via savepoints."""
        return self.core.transaction()

    # -- sessions and turns: core, tree, turns ------------------------------------------

    def get_session(self, ref: SessionRef) -> Session:
        return self.core.get_session(ref)

    def most_recent_session(self, *, include_archived: bool = False) -> Session | None:
        return self.browse.most_recent_session(include_archived=include_archived)

    def create_session(
        self,
        *,
        model_id: str,
        system_prompt: str = "",
        system_token_ids: Sequence[int] = (),
        name: str | None = None,
        options: dict[str, Any] | None = None,
        keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS,
        state: bytes | None = None,
        state_meta: StateMeta | None = None,
    ) -> Session:
        return self.turns.create_session(
            model_id=model_id, system_prompt=system_prompt, system_token_ids=system_token_ids, name=name,
            options=options, keep_snapshots=keep_snapshots, state=state, state_meta=state_meta)

    def rename_session(self, ref: SessionRef, name: str | None) -> Session:
        return self.turns.rename_session(ref, name)

    def set_archived(self, ref: SessionRef, archived: bool = True) -> Session:
        return self.turns.set_archived(ref, archived)

    def set_options(self, ref: SessionRef, options: dict[str, Any]) -> Session:
        return self.turns.set_options(ref, options)

    def get_turn(self, turn_id: int) -> Turn:
        return self.tree.get_turn(turn_id)

    def turn_token_ids(self, turn_id: int) -> list[int]:
        return self.tree.turn_token_ids(turn_id)

    def begin_turn(self, session: SessionRef, *, role: str, content: str = "",
                   token_ids: Sequence[int] | None = None, parent_turn_id: int | None = None) -> Turn:
        return self.turns.begin_turn(session, role=role, content=content, token_ids=token_ids,
                                     parent_turn_id=parent_turn_id)

    def update_streaming(self, turn_id: int, content: str) -> None:
        self.turns.update_streaming(turn_id, content)

    def commit_turn(
        self,
        turn_id: int,
        *,
        content: str | None = None,
        status: str = "complete",
        token_ids: Sequence[int] | None = None,
        stats: dict[str, Any] | None = None,
        error: str | None = None,
        state: bytes | None = None,
        state_meta: StateMeta | None = None,
    ) -> Turn:
        return self.turns.commit_turn(turn_id, content=content, status=status, token_ids=token_ids, stats=stats,
                                      error=error, state=state, state_meta=state_meta)

    def edit_turn(self, turn_id: int, *, content: str, token_ids: Sequence[int] | None = None) -> Turn:
        return self.turns.edit_turn(turn_id, content=content, token_ids=token_ids)

    def regenerate(self, turn_id: int) -> Turn:
        return self.turns.regenerate(turn_id)

    def siblings(self, turn_id: int) -> list[Turn]:
        return self.tree.siblings(turn_id)

    def set_head(self, session: SessionRef, turn_id: int, *, descend: bool = True) -> Turn:
        return self.turns.set_head(session, turn_id, descend=descend)

    def tail(self, session: SessionRef, limit: int = 50) -> list[Turn]:
        return self.tree.tail(session, limit)

    def page_before(self, session: SessionRef, turn_id: int, limit: int = 50) -> list[Turn]:
        return self.tree.page_before(session, turn_id, limit)

    def branch(self, session: SessionRef, turn_id: int | None = None) -> list[Turn]:
        return self.tree.branch(session, turn_id)

    def branch_token_ids(self, session: SessionRef, turn_id: int | None = None, *,
                         after_turn_id: int | None = None) -> Iterator[list[int]]:
        return self.tree.branch_token_ids(session, turn_id, after_turn_id=after_turn_id)

    # -- states: snapshots, chain ---------------------------------------------------------

    def put_snapshot(self, turn_id: int, state: bytes, meta: StateMeta) -> Snapshot:
        return self.states.put(turn_id, state, meta)

    def set_keep_snapshots(self, session: SessionRef, keep: int) -> None:
        self.states.set_keep(session, keep)

    def get_snapshot(self, snapshot_id: int) -> Snapshot:
        return self.states.get(snapshot_id)

    def snapshots(self, session: SessionRef) -> list[Snapshot]:
        return self.states.all(session)

    def latest_snapshot(self, session: SessionRef, turn_id: int | None = None) -> Snapshot | None:
        return self.states.latest(session, turn_id)

    def load_state(self, snapshot: Snapshot | int, *, expected_fingerprint: str | None) -> bytes:
        return self.states.load(snapshot, expected_fingerprint=expected_fingerprint)

    def resume(self, session: SessionRef, *, tail: int = 50, expected_fingerprint: str | None = None,
               load: bool = True) -> Resumed:
        return self.states.resume(session, tail=tail, expected_fingerprint=expected_fingerprint, load=load)

    def verify_branch(self, session: SessionRef, turn_id: int | None = None) -> int:
        return self.states.verify_branch(session, turn_id)

    def check_chain(self, session: SessionRef, turn_id: int | None = None) -> int:
        return self.chain.check_chain(session, turn_id)

    def rechain(self, session: SessionRef) -> tuple[int, int]:
        return self.chain.rechain(session)

    # -- leases -------------------------------------------------------------------------

    def lease_holder(self, session: SessionRef) -> LeaseInfo | None:
        return self.leases.holder(session)

    def acquire_lease(self, session: SessionRef) -> Lease:
        return self.leases.acquire(session)

    # -- browse ---------------------------------------------------------------------------

    def list_sessions(self, *, include_archived: bool = False, limit: int | None = None) -> list[SessionSummary]:
        return self.browse.list_sessions(include_archived=include_archived, limit=limit)

    def summary(self, session: SessionRef) -> SessionSummary:
        return self.browse.summary(session)

    def fork(self, session: SessionRef, turn_id: int | None = None, *, name: str | None = None) -> Session:
        return self.browse.fork(session, turn_id, name=name)

    def delete_session(self, session: SessionRef) -> None:
        self.browse.delete_session(session)

    def search(self, query: str, *, limit: int = 20, include_archived: bool = False) -> list[SearchHit]:
        return self.browse.search(query, limit=limit, include_archived=include_archived)

    def branch_matches(self, session: SessionRef, words: list[str], *, turn_id: int | None = None,
                       ending_by: int | None = None, limit: int = 50) -> list[Turn]:
        return self.browse.branch_matches(session, words, turn_id=turn_id, ending_by=ending_by, limit=limit)

    def add_probe_run(self, *, model_id: str, suite: str, payload: dict[str, Any],
                      session: SessionRef | None = None) -> RunRecord:
        return self.browse.add_probe_run(model_id=model_id, suite=suite, payload=payload, session=session)

    def list_probe_runs(self, *, session: SessionRef | None = None, limit: int = 50) -> list[RunRecord]:
        return self.browse.list_probe_runs(session=session, limit=limit)

    def add_finetune_run(self, *, model_id: str, kind: str, payload: dict[str, Any],
                         session: SessionRef | None = None) -> RunRecord:
        return self.browse.add_finetune_run(model_id=model_id, kind=kind, payload=payload, session=session)

    def list_finetune_runs(self, *, limit: int = 50) -> list[RunRecord]:
        return self.browse.list_finetune_runs(limit=limit)

    def export_json(self, session: SessionRef, turn_id: int | None = None) -> dict[str, Any]:
        return self.browse.export_json(session, turn_id)

    def export_markdown(self, session: SessionRef, turn_id: int | None = None) -> str:
        return self.browse.export_markdown(session, turn_id)
