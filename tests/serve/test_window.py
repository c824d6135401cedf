"""The default model's mixer served: a tiny random window + GLA hybrid (ring of sinks and
recent keys, positions, the GLA branch over evicted keys), with replies that outrun the
window; every stored state is a replay of the stored ids, and decoding steps in place."""

from __future__ import annotations

import threading

import httpx

from agent.runtime.generation import EagerRunner
from sessions import SessionStore

from .conftest import assert_stored_state_is_a_replay, running


def ask(server, **body) -> httpx.Response:
    r = httpx.post(server.base + "/chat/completions", timeout=120, json={"model": "tiny-window", **body})
    assert r.status_code == 200, r.text
    return r


def test_the_window_hybrid_is_served_and_every_stored_state_is_a_replay(db, window):
    with running(db, window, model_id="tiny-window", segment_len=16) as server:
        first = ask(server, temperature=0, max_tokens=20, messages=[
            {"role": "system", "content": "a system prompt longer than the window"}, {"role": "user", "content": "one"}])
        uid = first.json()["session"]
        with server.store() as store:
            assert_stored_state_is_a_replay(store, window, uid)
        with httpx.stream("POST", server.base + "/chat/completions", timeout=120, json={
                "model": "tiny-window", "max_tokens": 30, "seed": 3, "stream": True, "session": uid,
                "messages": [{"role": "user", "content": "two, and a little more than twelve tokens"}]}) as r:
            assert r.status_code == 200 and sum(1 for line in r.iter_lines() if line.startswith("data:")) > 2
        with server.store() as store:
            head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
            assert head.status == "complete" and head.tokens_total > 3 * window.config.window
            assert_stored_state_is_a_replay(store, window, uid)


def test_window_rows_batched_equal_rows_alone(db, window):
    with running(db, window, model_id="tiny-window", segment_len=16) as server:
        prompts = [f"prompt {i} " * (1 + 2 * i) for i in range(4)]
        body = {"temperature": 0.9, "seed": 5, "max_tokens": 16}
        alone = [ask(server, messages=[{"role": "user", "content": p}], **body).json()["choices"][0]["message"]["content"]
                 for p in prompts]
        together: list[str | None] = [None] * len(prompts)

        def go(i):
            together[i] = ask(server, messages=[{"role": "user", "content": prompts[i]}], **body).json()[
                "choices"][0]["message"]["content"]

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert together == alone
        assert any(int(w) > 1 for w in httpx.get(server.base + "/laplace/stats").json()["width_histogram"])


def test_decode_steps_write_the_batch_in_place(db, window, monkeypatch):
    """No copy of the whole batch state per token (21 MB a row on the default model)."""
    runner = EagerRunner(window.model, segment_len=16)
    monkeypatch.setattr(runner, "step", lambda *a: (_ for _ in ()).throw(AssertionError("step copies the state")))
    seen: list[tuple[int, ...]] = []
    with running(db, window, model_id="tiny-window", runner=runner) as server:
        sched = server.scheduler

        def record():
            batch = sched._batch
            if batch is not None and len(sched._batch_rows) == 2:
                seen.append(tuple(t.data_ptr() for t in batch.tensors.values()))

        sched.on_step = record
        threads = [threading.Thread(target=ask, args=(server,), kwargs={
            "temperature": 0, "max_tokens": 24, "messages": [{"role": "user", "content": f"row {i}"}]}) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = httpx.get(server.base + "/laplace/stats").json()
    assert len(seen) > 10 and len(set(seen)) <= stats["batch_rebuilds"]  # new tensors only when the rows change
    with SessionStore.open(db, readonly=True) as store:
        for summary in store.browse.list_sessions():
            assert_stored_state_is_a_replay(store, window, summary.session.uid)
