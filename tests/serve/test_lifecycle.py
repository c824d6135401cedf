"""Admission is bookkeeping (the model runs only in the loop's segmented prefill and decode
steps), a cancel never leaves a turn to replay, and stopping answers every request."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import pytest

from agent.chat.taking import release
from agent.runtime.generation import EagerRunner
from agent.runtime.state import RecurrentState
from agent.serve.protocol import ApiError, ChatRequest
from agent.serve.rows import Failed, Handle
from agent.serve.server import shut_down
from sessions import SessionError, SessionStore

from .conftest import assert_stored_state_is_a_replay, running


def ask(server, **body) -> httpx.Response:
    return httpx.post(server.base + "/chat/completions", timeout=60, json={"model": "tiny", "max_tokens": 4, **body})


def test_admission_runs_no_model_and_owed_turns_are_read_segment_by_segment(db, lm, monkeypatch):
    with running(db, lm, segment_len=32) as server:
        first = ask(server, messages=[{"role": "user", "content": "first"}]).json()
        uid = first["session"]
        with SessionStore.open(db) as store:  # turns stored after the newest snapshot, as a crash leaves them
            for text in ("a message the state never read " * 3, "another one"):
                store.turns.begin_turn(uid, role="user", content=text,
                                       token_ids=lm.template.message(lm.tokenizer, "user", text))
        sched, runner = server.scheduler, server.writer.runner
        admitting, calls = threading.Event(), []
        real_admit, real_prefill, real_step = sched._admit, runner.prefill, runner.step_

        def admit(job):
            admitting.set()
            try:
                real_admit(job)
            finally:
                admitting.clear()

        def prefill(ids, state=None, progress=None):
            calls.append(("prefill", len(ids), admitting.is_set()))
            return real_prefill(ids, state, progress)

        def step_(tokens, state):
            calls.append(("step", 1, admitting.is_set()))
            return real_step(tokens, state)

        monkeypatch.setattr(sched, "_admit", admit)
        monkeypatch.setattr(runner, "prefill", prefill)
        monkeypatch.setattr(runner, "step_", step_)
        long_system = "You are a careful assistant. " * 20  # several segments
        new = ask(server, messages=[{"role": "system", "content": long_system}, {"role": "user", "content": "hi"}])
        old = ask(server, session=uid, messages=[{"role": "user", "content": "and now?"}])
        assert new.status_code == old.status_code == 200, (new.text, old.text)
        assert calls and not any(during for _, _, during in calls)  # nothing ran inside an admission
        assert all(n <= 32 for kind, n, _ in calls if kind == "prefill")  # every read is a segment at most
        with SessionStore.open(db, readonly=True) as store:
            assert_stored_state_is_a_replay(store, lm, new.json()["session"])
            assert_stored_state_is_a_replay(store, lm, uid)
            assert store.core.get_session(new.json()["session"]).system_prompt == long_system
            root = store.tree.branch(new.json()["session"])[0]  # the system turn got its state, as chat stores it
            snap = store.states.latest(new.json()["session"], root.id)
            assert snap is not None and snap.turn_id == root.id and snap.n_tokens == root.tokens_total
            stored = RecurrentState.from_bytes(store.states.load(snap, expected_fingerprint=lm.fingerprint))
            _, ref = EagerRunner(lm.model, segment_len=64).prefill(store.tree.turn_token_ids(root.id))
            assert stored.allclose(ref, rtol=1e-4, atol=1e-5)
        assert new.json()["usage"]["prompt_tokens"] > len(long_system)  # the system prompt was read for it


def test_a_request_cancelled_before_its_prompt_was_read_commits_with_a_state(db, endless):
    with running(db, endless, widths=(1,), segment_len=16) as server:
        busy = {"model": "tiny", "temperature": 0, "max_tokens": 3000, "stream": True,
                "messages": [{"role": "user", "content": "hold the only row"}]}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base + "/chat/completions", json=busy) as r1:
                next(r1.iter_lines())
                waiting = {**busy, "max_tokens": 5, "messages": [{"role": "user", "content": "long prompt " * 30}]}
                with http.stream("POST", server.base + "/chat/completions", json=waiting) as r2:
                    uid = r2.headers["x-laplace-session"]  # admitted: its rows are stored; then it goes away
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with server.store() as store:
                head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
                if head.status != "streaming" and not server.scheduler.load()["active"]:
                    break
            time.sleep(0.05)
        with server.store() as store:
            head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
            assert (head.role, head.status, head.content) == ("assistant", "cancelled", "")
            assert store.states.latest(uid).turn_id == head.id  # nothing left for the next request to replay
            assert_stored_state_is_a_replay(store, endless, uid)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_job_submitted_as_the_scheduler_stops_is_answered(db, lm):
    with running(db, lm) as server:
        sched = server.scheduler
        loop = asyncio.new_event_loop()
        handle, outcome = Handle(loop), {}
        real_cancel_all = sched._cancel_all

        def cancel_all_then_a_request_arrives():
            real_cancel_all()
            try:  # the loop died (not stopped): the old check let this in after the last drain
                sched.submit(ChatRequest(model="tiny", message="late"), handle)
                outcome["queued"] = True
            except ApiError as exc:
                outcome["refused"] = exc.status

        def die():
            raise RuntimeError("the loop fails")

        sched._cancel_all = cancel_all_then_a_request_arrives
        sched.on_step = die
        ask(server, messages=[{"role": "user", "content": "wake up"}])
        sched._thread.join(30)
        if outcome.get("queued"):  # queued: then it must have been answered
            event = loop.run_until_complete(asyncio.wait_for(handle.get(), 5))
            assert isinstance(event, Failed) and event.error.status == 503
        else:
            assert outcome == {"refused": 503}
        loop.close()


def test_the_store_is_closed_only_once_the_scheduler_has_stopped(db, lm):
    class Store:
        closed = False

        def close(self):
            self.closed = True

    with running(db, lm) as server:
        release_it = threading.Event()
        server.scheduler.on_step = lambda: release_it.wait(30)  # a loop stuck in a long step
        threading.Thread(target=lambda: ask(server, messages=[{"role": "user", "content": "x"}]), daemon=True).start()
        time.sleep(0.5)
        store = Store()
        assert shut_down(server.scheduler, store, timeout=0.2) is False and not store.closed
        release_it.set()
        server.scheduler.on_step = None
        assert shut_down(server.scheduler, store, timeout=30) is True and store.closed


def test_release_logs_a_lease_already_gone_and_reports_anything_else(caplog):
    class Gone:
        def release(self):
            raise SessionError("the lease was taken over")

    class Broken:
        def release(self):
            raise RuntimeError("a bug")

    with caplog.at_level(logging.INFO, logger="laplace.serve"):
        release(Gone())
        release(Broken())
    levels = [(r.levelno, r.exc_info is not None) for r in caplog.records]
    assert levels == [(logging.INFO, False), (logging.ERROR, True)]


def test_a_session_is_hashed_and_loaded_again_only_when_someone_else_wrote_to_it(db, lm, monkeypatch):
    with running(db, lm) as server:
        store = server.writer.store
        calls: dict[str, int] = {"chain": 0, "load": 0}
        for name, obj, attr in (("chain", store.chain, "check_chain"), ("load", store.states, "load")):
            real = getattr(obj, attr)
            monkeypatch.setattr(obj, attr, lambda *a, _real=real, _name=name, **k: (
                calls.__setitem__(_name, calls[_name] + 1), _real(*a, **k))[1])
        uid = ask(server, messages=[{"role": "user", "content": "one"}]).json()["session"]
        for text in ("two", "three"):
            assert ask(server, session=uid, messages=[{"role": "user", "content": text}]).status_code == 200
        assert calls == {"chain": 0, "load": 0}  # every turn since the session was made is this server's own
        with server.store() as view:
            assert_stored_state_is_a_replay(view, lm, uid)
        with SessionStore.open(db) as other:  # another writer adds a turn: checked and loaded again
            other.turns.begin_turn(uid, role="user", content="from elsewhere",
                                   token_ids=lm.template.message(lm.tokenizer, "user", "from elsewhere"))
        assert ask(server, session=uid, messages=[{"role": "user", "content": "four"}]).status_code == 200
        assert calls == {"chain": 1, "load": 1}
        with server.store() as store:
            assert_stored_state_is_a_replay(store, lm, uid)
