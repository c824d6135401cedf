"""The lease part of `SessionStore`: one writer per session.

A lease row names its owner (a token per store), pid and host, and expires `ttl_s` after
the last heartbeat, so a crashed holder cannot keep a session forever; on the same host a
lease whose pid is gone is stale at once. Every write to a session checks the lease in its
own transaction (`guard`); readers never look at it.
"""

from __future__ import annotations

import os
import socket
import uuid

from .database import utcnow
from .errors import SessionInUse
from .records import LeaseInfo
from .store_core import SessionRef, StoreCore

_HOST = socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class Lease:
    """The right to write one session; renew with `heartbeat()`, end with `release()`."""

    def __init__(self, leases: "Leases", session_id: int, session_uid: str) -> None:
        self.leases = leases
        self.session_id = session_id
        self.session_uid = session_uid

    def heartbeat(self) -> None:
        """Extend the lease; raises SessionInUse if another writer took it after it expired."""
        with self.leases.core.transaction():
            self.leases.guard(self.session_id, claim=True)

    def release(self) -> None:
        self.leases.forget(self.session_id)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Leases:
    """Taking, checking and releasing this store's leases."""

    def __init__(self, core: StoreCore, *, ttl_s: float) -> None:
        self.core = core
        self.ttl_s = ttl_s
        # Identifies this store's leases; a second store in the same process is another writer.
        self.owner = uuid.uuid4().hex
        self._held: dict[int, Lease] = {}

    def _is_live(self, lease: LeaseInfo) -> bool:
        if lease.expires_at <= self.core.clock():
            return False
        return lease.hostname != _HOST or _pid_alive(lease.pid)

    def _row(self, session_id: int) -> LeaseInfo | None:
        row = self.core.one("SELECT session_id, owner, pid, hostname, expires_at FROM session_leases"
                            " WHERE session_id = ?", [session_id])
        return LeaseInfo(session_id=row[0], owner=row[1], pid=row[2], hostname=row[3], expires_at=row[4]) \
            if row else None

    def holder(self, session: SessionRef) -> LeaseInfo | None:
        """The live lease on a session, if any (for `sessions show`)."""
        info = self._row(self.core.get_session(session).id)
        return info if info and self._is_live(info) else None

    def guard(self, session_id: int, *, claim: bool = False) -> None:
        """Inside a write transaction: fail if another live writer holds the session; renew
        our own lease (every write is a heartbeat); take the lease when `claim`."""
        other = self._row(session_id)
        now = self.core.clock()
        if other is not None and other.owner != self.owner:
            if self._is_live(other):
                raise SessionInUse(self.core.session_uid(session_id), other.pid, other.hostname,
                                   other.expires_at - now)
            if not claim:
                return
        if other is None and not claim:
            return
        self.core.db.execute(
            "INSERT INTO session_leases (session_id, owner, pid, hostname, acquired_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET owner = excluded.owner,"
            " pid = excluded.pid, hostname = excluded.hostname, expires_at = excluded.expires_at",
            [session_id, self.owner, os.getpid(), _HOST, now, now + self.ttl_s],
        )

    def acquire(self, session: SessionRef) -> Lease:
        """Become the session's only writer, or raise SessionInUse naming the holder.

        Turns a dead writer left `streaming` are marked cancelled (their text is kept):
        holding the lease proves nobody is still streaming into them.
        """
        s = self.core.get_session(session)
        with self.core.transaction():
            self.guard(s.id, claim=True)
            self.core.db.execute(
                "UPDATE turns SET status = 'cancelled', error = 'interrupted: the writer stopped mid-reply',"
                " updated_at = ? WHERE session_id = ? AND status = 'streaming'", [utcnow(), s.id])
        lease = Lease(self, s.id, s.uid)
        self._held[s.id] = lease
        return lease

    def forget(self, session_id: int) -> None:
        """Give up our lease on a session (what `Lease.release` does)."""
        self._held.pop(session_id, None)
        with self.core.transaction():
            self.core.db.execute("DELETE FROM session_leases WHERE session_id = ? AND owner = ?",
                                 [session_id, self.owner])

    def release_all(self) -> None:
        for lease in list(self._held.values()):
            lease.release()
