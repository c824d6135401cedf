"""The read-mostly half of `ChatService`: listing, search, export, status and turn views.

Split from `agent/chat/service.py` to keep each file to one job; it relies on the attributes that
`ChatService.__init__` sets (`store`, `lm`, `model_id`, `device`, `_session`, `_state`, ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Literal, TypeVar

from agent.chat.recall import is_recall
from agent.chat.types import ChatError, SearchHit, SessionView, StatusView, TurnView
from sessions import Session, SessionError, SessionSummary, Turn

T = TypeVar("T")


def guarded(fn: Callable[[], T]) -> T:
    """Run a store call, turning its one-line SessionError into a ChatError."""
    try:
        return fn()
    except SessionError as exc:
        raise ChatError(str(exc)) from None


class SessionBrowsing:
    """Mixin for ChatService; the attributes below are set by its __init__."""

    store: Any
    lm: Any
    model_id: str
    device: str
    _session: Session | None
    _state: Any
    _lock: Any
    _last_tps: float | None

    def list_sessions(self) -> list[SessionView]:
        return [self._view(s.session, s) for s in self.store.browse.list_sessions()]

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        return [SearchHit(h.session_uid, h.session_name or h.session_uid[:8], h.turn_id, h.role, h.snippet)
                for h in self.store.browse.search(query, limit=limit)]

    def delete_session(self, uid_prefix: str) -> None:
        with self._lock:
            target = guarded(lambda: self.store.core.get_session(uid_prefix))
            if self._session is not None and target.id == self._session.id:
                self._release()
                self._session, self._state = None, None
            guarded(lambda: self.store.browse.delete_session(target.id))

    def export(self, fmt: Literal["markdown", "json"], path: Path | None = None) -> Path:
        session = self._require()
        suffix = "md" if fmt == "markdown" else "json"
        out = Path(path) if path else Path.cwd() / f"laplace-{session.uid[:8]}.{suffix}"
        browse = self.store.browse
        body = browse.export_markdown(session.id) if fmt == "markdown" else json.dumps(browse.export_json(session.id), indent=2)
        try:
            out.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise ChatError(f"cannot write {out}: {exc.strerror or exc}; choose another path") from None
        return out

    def status(self) -> StatusView:
        state = self._state
        n = state.n_tokens if state is not None else 0
        s = self._session
        return StatusView(model=self.model_id, device=self.device, session_uid=s.uid if s else None,
                          session_name=(s.name or s.uid[:8]) if s else "", tokens_folded=n,
                          state_bytes=self.lm.config.state_bytes(), kv_cache_bytes=self.lm.config.kv_cache_bytes(n),
                          last_tokens_per_s=self._last_tps)

    def tail(self, limit: int = 50) -> list[TurnView]:
        return [self._turn_view(t) for t in self.store.tree.tail(self._require().id, limit)]

    def page_before(self, turn_id: int, limit: int = 50) -> list[TurnView]:
        return [self._turn_view(t) for t in self.store.tree.page_before(self._require().id, turn_id, limit)]

    def _turn_view(self, t: Turn) -> TurnView:
        sibs = self.store.tree.siblings(t.id) if t.role in ("assistant", "user") else [t]
        index = next((i for i, s in enumerate(sibs) if s.id == t.id), 0)
        return TurnView(t.id, t.role, t.content, t.status, t.parent_id, t.n_tokens, index, len(sibs),
                        kind="recall" if is_recall(t) else "", used_recall=self._after_recall(t))

    def _after_recall(self, t: Turn) -> bool:
        """A reply whose message came right after a recall block (the block, the message, it)."""
        if t.role != "assistant" or t.parent_id is None:
            return False
        user = self.store.tree.get_turn(t.parent_id)
        return user.parent_id is not None and is_recall(self.store.tree.get_turn(user.parent_id))

    def _view(self, s: Session, summary: SessionSummary | None = None) -> SessionView:
        summary = summary or self.store.browse.summary(s.id)
        return SessionView(s.uid, s.name or s.uid[:8], s.model_id, s.system_prompt, summary.turns,
                           summary.tokens_folded, summary.state_bytes, s.updated_at, s.archived)

