"""An in-memory `ChatServiceProtocol` for the TUI's tests: `FakeChatService`.

A test double, so it lives with the tests and never in the wheel (`laplace bench tui` runs
the app over the real service instead). No model, no SQL: turns are a tree kept in dicts;
replies are scripted text streamed token by token with a small delay, honouring the cancel
event between tokens, like the real service. Every call is recorded in `calls` so
tests can assert that a UI action reached the service.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Literal, Sequence

from agent.chat.types import (
    FORGOTTEN,
    REMEMBERED,
    ChatError,
    ChatEvent,
    ProbeAnswer,
    ProgressEvent,
    SearchHit,
    SessionView,
    StateUnusableError,
    StatsEvent,
    StatusView,
    TokenEvent,
    TurnFinished,
    TurnStarted,
    TurnView,
)

STATE_BYTES = 29_500_000
KV_BYTES_PER_TOKEN = 294_912  # a 3B-class softmax model (fp16 K and V, 36 layers, 2048 dims)
_TOKEN_RE = re.compile(r"\s*\S+|\s+")


def default_reply(text: str) -> str:
    head = text.strip().splitlines()[0][:60] if text.strip() else ""
    return (
        f"You said: *{head}*\n\nHere is some code:\n\n```python\nprint('hello')\n```\n\n"
        "And a second block:\n\n```sh\necho done\n```\n"
    )


@dataclass
class _Session:
    uid: str
    name: str
    system: str
    path: list[int] = field(default_factory=list)  # turn ids on the active branch
    updated: float = 0.0


__all__ = ["FakeChatService", "default_reply", "fake_with_history"]


class FakeChatService:
    """Scripted chat service. `token_delay` is the pause before each streamed token."""

    release: threading.Event

    def __init__(
        self,
        *,
        token_delay: float = 0.002,
        reply: Callable[[str], str] = default_reply,
        model: str = "fake-gla-3b",
        device: str = "cpu",
        hold_after: int | None = None,
        window: int | None = None,
    ) -> None:
        self.token_delay = token_delay
        # With window=N the fake acts like a window model that holds its last N tokens
        # exactly (no sinks, no memory): `transcript_only` names the turns before them.
        # None: a model with no exact tokens (the question does not apply).
        self.window = window
        # With hold_after=N a reply stops after N tokens until `release` is set (or cancel):
        # lets a test look at the UI mid-reply deterministically.
        self.hold_after = hold_after
        self.release = threading.Event()
        self.reply = reply
        self.model = model
        self.device = device
        self.calls: list[tuple[object, ...]] = []
        self.cancelled: list[int] = []  # assistant turn ids whose generation saw the cancel
        self.options: dict[str, str] = {}
        # Set to a recall block's text to have the next `send` fold it before the message,
        # as the real service's recall refresh does (it is then cleared).
        self.next_recall: str | None = None
        self.unusable: set[str] = set()  # uids whose resume raises StateUnusableError
        self._lock = threading.RLock()
        self._sessions: dict[str, _Session] = {}
        self._turns: dict[int, TurnView] = {}
        self._children: dict[int | None, list[int]] = {}
        self._current: _Session | None = None
        self._next_turn = 1
        self._next_session = 1
        self._clock = 0.0
        self._last_tps: float | None = None

    # ---- helpers -------------------------------------------------------------------------

    def _tick(self) -> float:
        self._clock += 1.0
        return self._clock

    def _need(self) -> _Session:
        if self._current is None:
            raise ChatError("no session is open; start one with /new")
        return self._current

    def _view(self, s: _Session) -> SessionView:
        turns = [self._turns[i] for i in s.path]
        return SessionView(
            uid=s.uid, name=s.name, model=self.model, system_prompt=s.system, turns=len(turns),
            tokens_folded=sum(t.n_tokens for t in turns), state_bytes=STATE_BYTES,
            updated_at=f"2025-01-01T00:00:{int(s.updated) % 60:02d}",
        )

    def _with_siblings(self, turn: TurnView) -> TurnView:
        sibs = self._children.get(turn.parent_id, [turn.id])
        return replace(turn, sibling_index=sibs.index(turn.id), sibling_count=len(sibs))

    def _add_turn(self, s: _Session, role: str, content: str, status: str = "complete") -> TurnView:
        parent = s.path[-1] if s.path else None
        turn = TurnView(id=self._next_turn, role=role, content=content, status=status,  # type: ignore[arg-type]
                        parent_id=parent, n_tokens=len(_TOKEN_RE.findall(content)))
        self._next_turn += 1
        self._turns[turn.id] = turn
        self._children.setdefault(parent, []).append(turn.id)
        s.path.append(turn.id)
        s.updated = self._tick()
        return turn

    def add_history(self, n_turns: int, *, name: str | None = None, system: str | None = None) -> SessionView:
        """Create and open a session holding `n_turns` alternating user/assistant turns,
        after a system turn holding `system` when given (the real store's first turn)."""
        with self._lock:
            s = self._new(name=name or f"history-{n_turns}", system=system or "")
            if system is not None:
                self._add_turn(s, "system", system)
            for i in range(n_turns):
                if i % 2 == 0:
                    self._add_turn(s, "user", f"question {i // 2}: what is {i} + {i}?")
                else:
                    self._add_turn(s, "assistant", f"Answer {i // 2}: **{i - 1 + i - 1}**.\n\n```\n{i}\n```")
            return self._view(s)

    def _new(self, *, name: str | None, system: str | None) -> _Session:
        uid = f"{self._next_session:04d}{'abcdef0123456789' * 2}"[:16]
        self._next_session += 1
        s = _Session(uid=uid, name=name or f"session {self._next_session - 1}", system=system or "")
        s.updated = self._tick()
        self._sessions[uid] = s
        self._current = s
        return s

    def _stream(self, s: _Session, text: str, cancel: threading.Event | None,
                user_turn: TurnView | None, parent: int | None, recall: TurnView | None = None) -> Iterator[ChatEvent]:
        asst_id = self._next_turn
        self._next_turn += 1
        yield TurnStarted(user_turn=user_turn, assistant_turn_id=asst_id, recall_turn=recall)
        out: list[str] = []
        status = "complete"
        start = time.perf_counter()
        for i, tok in enumerate(_TOKEN_RE.findall(self.reply(text))):
            if i == self.hold_after:
                while not self.release.wait(0.005) and not (cancel is not None and cancel.is_set()):
                    pass
            if cancel is not None and cancel.is_set():
                status = "cancelled"
                break
            if self.token_delay:
                time.sleep(self.token_delay)
            out.append(tok)
            yield TokenEvent(tok)
        else:
            if cancel is not None and cancel.is_set():
                status = "cancelled"
        elapsed = max(time.perf_counter() - start, 1e-6)
        with self._lock:
            turn = TurnView(id=asst_id, role="assistant", content="".join(out), status=status,  # type: ignore[arg-type]
                            parent_id=parent, n_tokens=len(out), used_recall=recall is not None)
            self._turns[asst_id] = turn
            self._children.setdefault(parent, []).append(asst_id)
            s.path.append(asst_id)
            s.updated = self._tick()
            if status == "cancelled":
                self.cancelled.append(asst_id)
            self._last_tps = len(out) / elapsed
            view = self._view(s)
            final = self._with_siblings(turn)
        yield StatsEvent(new_tokens=len(out), tokens_per_s=self._last_tps,
                         tokens_folded=view.tokens_folded, state_bytes=STATE_BYTES)
        yield TurnFinished(turn=final)

    # ---- the protocol ----------------------------------------------------------------------

    @property
    def session(self) -> SessionView | None:
        with self._lock:
            return self._view(self._current) if self._current else None

    def status(self) -> StatusView:
        with self._lock:
            view = self._view(self._current) if self._current else None
            folded = view.tokens_folded if view else 0
            return StatusView(
                model=self.model, device=self.device, session_uid=view.uid if view else None,
                session_name=view.name if view else "", tokens_folded=folded,
                state_bytes=STATE_BYTES, kv_cache_bytes=folded * KV_BYTES_PER_TOKEN,
                last_tokens_per_s=self._last_tps,
            )

    def new_session(self, *, system: str | None = None, name: str | None = None) -> SessionView:
        self.calls.append(("new_session", system, name))
        with self._lock:
            return self._view(self._new(name=name, system=system))

    def _match(self, uid_prefix: str) -> _Session:
        found = [s for uid, s in self._sessions.items() if uid.startswith(uid_prefix)]
        if len(found) != 1:
            raise ChatError(f"{'no' if not found else 'more than one'} session matches {uid_prefix!r}")
        return found[0]

    def resume(self, uid_prefix: str | None = None) -> SessionView:
        self.calls.append(("resume", uid_prefix))
        with self._lock:
            if uid_prefix is None:
                if not self._sessions:
                    raise ChatError("there are no sessions yet")
                s = max(self._sessions.values(), key=lambda x: x.updated)
            else:
                s = self._match(uid_prefix)
            self._current = s
            if s.uid in self.unusable:
                raise StateUnusableError(f"state of {s.uid[:8]} was saved by another model")
            return self._view(s)

    def rebuild_state(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        self.calls.append(("rebuild_state",))
        s = self._need()
        total = max(len(s.path), 1)
        for done in range(0, total + 1, max(total // 10, 1)):
            if cancel is not None and cancel.is_set():
                return
            time.sleep(self.token_delay)
            yield ProgressEvent("replaying transcript", min(done, total), total)
        yield ProgressEvent("replaying transcript", total, total)
        self.unusable.discard(s.uid)

    def tail(self, limit: int = 50) -> list[TurnView]:
        with self._lock:
            s = self._need()
            return [self._with_siblings(self._turns[i]) for i in s.path[-limit:]]

    def page_before(self, turn_id: int, limit: int = 50) -> list[TurnView]:
        with self._lock:
            s = self._need()
            i = s.path.index(turn_id)
            return [self._with_siblings(self._turns[t]) for t in s.path[max(0, i - limit):i]]

    def transcript_only(self, turn_ids: Sequence[int]) -> set[int] | None:
        with self._lock:
            if self.window is None or self._current is None:
                return None
            stops, total = {}, 0
            for i in self._current.path:
                total += self._turns[i].n_tokens
                stops[i] = total
            wanted = set(turn_ids)
            return {i for i in self._current.path if i in wanted and self._turns[i].n_tokens
                    and stops[i] <= total - self.window}

    def send(self, text: str, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        self.calls.append(("send", text))
        with self._lock:
            s = self._need()
            recall = None
            if self.next_recall is not None:
                recall = replace(self._add_turn(s, "document", self.next_recall), kind="recall")
                self._turns[recall.id] = recall
                self.next_recall = None
            user = self._with_siblings(self._add_turn(s, "user", text))
        yield from self._stream(s, text, cancel, user, user.id, recall)

    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        self.calls.append(("regenerate",))
        with self._lock:
            s = self._need()
            if not s.path or self._turns[s.path[-1]].role != "assistant":
                raise ChatError("nothing to regenerate: the last turn is not a reply")
            s.path.pop()
            user = self._turns[s.path[-1]]
        yield from self._stream(s, user.content, cancel, None, user.id)

    def switch_sibling(self, turn_id: int, step: int) -> TurnView:
        self.calls.append(("switch_sibling", turn_id, step))
        with self._lock:
            s = self._need()
            sibs = self._children.get(self._turns[turn_id].parent_id, [turn_id])
            if len(sibs) < 2:
                raise ChatError("this turn has no other versions; regenerate a reply to make one")
            target = sibs[(sibs.index(turn_id) + step) % len(sibs)]
            path = s.path[: s.path.index(turn_id)] + [target]
            while self._children.get(path[-1]):  # down to the newest leaf
                path.append(self._children[path[-1]][-1])
            s.path = path
            return self._with_siblings(self._turns[target])

    def attach(self, path: Path, cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        self.calls.append(("attach", Path(path)))
        s = self._need()
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise ChatError(f"cannot read {path}: {e.strerror}; check the path") from None
        segments = max(1, len(text) // 4096 + 1)
        for i in range(segments):
            if cancel is not None and cancel.is_set():
                return
            time.sleep(self.token_delay)
            yield ProgressEvent(f"attaching {Path(path).name}", i + 1, segments)
        with self._lock:
            turn = self._add_turn(s, "document", text)
        yield TurnFinished(turn=self._with_siblings(turn))

    def probe(self, question: str, expected: str | None = None) -> ProbeAnswer:
        self.calls.append(("probe", question, expected))
        with self._lock:
            s = self._need()
            history = " ".join(self._turns[i].content for i in s.path)
        if expected is None:
            return ProbeAnswer(question, "I am not sure.", None, None)
        ok = expected.lower() in history.lower()
        return ProbeAnswer(question, expected if ok else "I don't know.", expected,
                           REMEMBERED if ok else FORGOTTEN, detail="substring match (fake)")

    def fork(self, at_turn: int | None = None) -> SessionView:
        self.calls.append(("fork", at_turn))
        with self._lock:
            src = self._need()
            cut = len(src.path) if at_turn is None else src.path.index(at_turn) + 1
            s = self._new(name=f"{src.name} (fork)", system=src.system)
            s.path = list(src.path[:cut])
            return self._view(s)

    def rename(self, name: str) -> SessionView:
        self.calls.append(("rename", name))
        with self._lock:
            s = self._need()
            s.name = name
            return self._view(s)

    def set_system(self, text: str) -> SessionView:
        """Like the real service: a new session with this system prompt; the old one is kept."""
        self.calls.append(("set_system", text))
        with self._lock:
            return self._view(self._new(name=None, system=text))

    def set_option(self, key: str, value: str) -> None:
        self.calls.append(("set_option", key, value))
        if key not in {"temperature", "top_p", "top_k", "max_tokens", "seed"}:
            raise ChatError(f"unknown option {key!r}; try temperature, top_p, top_k, max_tokens, seed")
        self.options[key] = value

    def list_sessions(self) -> list[SessionView]:
        with self._lock:
            ordered = sorted(self._sessions.values(), key=lambda x: -x.updated)
            return [self._view(s) for s in ordered]

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        self.calls.append(("search", query))
        hits: list[SearchHit] = []
        with self._lock:
            for s in self._sessions.values():
                for tid in s.path:
                    t = self._turns[tid]
                    pos = t.content.lower().find(query.lower())
                    if pos >= 0:
                        hits.append(SearchHit(s.uid, s.name, tid, t.role, t.content[max(0, pos - 20):pos + 40]))
                        if len(hits) >= limit:
                            return hits
        return hits

    def delete_session(self, uid_prefix: str) -> None:
        self.calls.append(("delete_session", uid_prefix))
        with self._lock:
            s = self._match(uid_prefix)
            del self._sessions[s.uid]
            if self._current is s:
                self._current = None

    def export(self, fmt: Literal["markdown", "json"], path: Path | None = None) -> Path:
        self.calls.append(("export", fmt, path))
        with self._lock:
            s = self._need()
            turns = [self._turns[i] for i in s.path]
        out = Path(path) if path else Path.cwd() / f"{s.uid[:8]}.{'md' if fmt == 'markdown' else 'json'}"
        if fmt == "json":
            out.write_text(json.dumps([t.__dict__ for t in turns]), encoding="utf-8")
        else:
            out.write_text("\n\n".join(f"## {t.role}\n\n{t.content}" for t in turns), encoding="utf-8")
        return out

    def close(self) -> None:
        self.calls.append(("close",))


def fake_with_history(n_turns: int, *, token_delay: float = 0.0005) -> FakeChatService:
    """A fake whose current session already holds `n_turns` turns."""
    fake = FakeChatService(token_delay=token_delay)
    fake.add_history(n_turns)
    return fake
