"""The server with real clients on 127.0.0.1: the openai package (streaming and not) and
httpx. Every turn must land in the store exactly as `laplace chat` writes it."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from agent.chat.service import ChatService
from agent.runtime.generation import EagerRunner
from sessions import SessionStore

from .conftest import assert_stored_state_is_a_replay, running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=60)


def test_plain_request_makes_a_session_and_answers_in_openai_shape(server, lm):
    reply = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        max_tokens=12, seed=3)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    extra = reply.model_extra
    uid = extra["session"]
    assert extra["laplace"]["session"] == uid and extra["laplace"]["created_session"] is True
    with server.store() as store:
        session = store.core.get_session(uid)
        assert session.system_prompt == "be brief" and session.model_id == "tiny"
        turns = store.tree.branch(session.id, session.head_turn_id)
        assert [(t.role, t.status) for t in turns] == [("system", "complete"), ("user", "complete"), ("assistant", "complete")]
        assert turns[-1].content == choice.message.content
        assert turns[-1].stats["new_tokens"] == reply.usage.completion_tokens
        # usage: every token folded for this request (system, message, reply prefix) and generated
        assert reply.usage.prompt_tokens == turns[0].n_tokens + turns[1].n_tokens + 1
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        assert extra["laplace"]["tokens_folded"] == turns[-1].tokens_total
        assert_stored_state_is_a_replay(store, lm, uid)


def test_streaming_with_the_openai_client_matches_what_is_stored(server, lm):
    chunks = list(client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "tell me"}], max_tokens=16, seed=5, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[0] in ("stop", "length")
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens > 0
    uid = chunks[0].model_extra["session"]
    with server.store() as store:
        head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
        assert (head.role, head.status, head.content) == ("assistant", "complete", text)
        assert head.stats["new_tokens"] == usage.completion_tokens
        assert_stored_state_is_a_replay(store, lm, uid)


def test_session_header_and_continuing_from_the_saved_state(server, lm):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        first = http.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 8,
                                                         "messages": [{"role": "user", "content": "one"}]})
        uid = first.headers["x-laplace-session"]
        assert first.json()["session"] == uid
        folded = first.json()["laplace"]["tokens_folded"]
        # A client resending the whole conversation with the session id: only the last message is new.
        second = http.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 8, "session": uid[:8],
            "messages": [{"role": "system", "content": "ignored"}, {"role": "user", "content": "one"},
                         {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "two"}]})
        body = second.json()
        assert second.status_code == 200 and body["session"] == uid and body["laplace"]["created_session"] is False
        assert body["usage"]["prompt_tokens"] == len(lm.template.message(lm.tokenizer, "user", "two")) + 1
        assert body["laplace"]["tokens_folded"] == folded + body["usage"]["total_tokens"] + 2  # + the reply's suffix
    with server.store() as store:
        roles = [(t.role, t.content) for t in store.tree.branch(uid)][:4]
        assert [r for r, _ in roles] == ["system", "user", "assistant", "user"] and roles[3][1] == "two"
        assert_stored_state_is_a_replay(store, lm, uid)


def test_earlier_messages_of_a_plain_request_are_folded_as_turns(server, lm):
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "my code is 48213"},
                {"role": "assistant", "content": "noted"},
                {"role": "user", "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "my code?"}]}]
    reply = client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=6)
    uid = reply.model_extra["session"]
    with server.store() as store:
        turns = store.tree.branch(uid)
        assert [(t.role, t.content, t.status) for t in turns[:4]] == [
            ("system", "sys", "complete"), ("user", "my code is 48213", "complete"),
            ("assistant", "noted", "complete"), ("user", "what is my code?", "complete")]
        tok, template = lm.tokenizer, lm.template
        assert store.tree.turn_token_ids(turns[2].id) == [*template.reply_prefix(tok), *tok.encode("noted"),
                                                          *template.reply_suffix(tok)]
        assert_stored_state_is_a_replay(store, lm, uid)


def test_a_server_turn_leaves_the_rows_a_chat_turn_leaves(server, lm, tmp_path):
    """Same model, same message, greedy: the same ids, text, statuses and stats keys."""
    body = {"model": "tiny", "temperature": 0, "max_tokens": 10,
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello there"}]}
    uid = httpx.post(server.base + "/chat/completions", json=body, timeout=60).json()["session"]
    chat_store = SessionStore.open(tmp_path / "chat.db")
    svc = ChatService(chat_store, lm, model_id="tiny", runner=EagerRunner(lm.model, segment_len=32),
                      options={"temperature": 0, "max_new_tokens": 10})
    try:
        svc.new_session(system="s")
        list(svc.send("hello there"))
        chat_turns = chat_store.tree.branch(svc.session.uid)
        with server.store() as store:
            served = store.tree.branch(uid)
            assert [(t.role, t.status, t.content, t.n_tokens, t.stream_hash) for t in served] == \
                   [(t.role, t.status, t.content, t.n_tokens, t.stream_hash) for t in chat_turns]
            assert [sorted(t.stats) for t in served] == [sorted(t.stats) for t in chat_turns]
            assert [store.states.latest(uid).turn_id == served[-1].id, store.states.latest(uid).n_tokens] == \
                   [True, chat_store.states.latest(svc.session.uid).n_tokens]
    finally:
        svc.close()
        chat_store.close()


def _ask(url: str, prompt: str, **extra) -> str:
    body = {"model": "tiny", "max_tokens": 12, "messages": [{"role": "user", "content": prompt}], **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_batched_replies_equal_replies_alone(server):
    """Padding rows and batch neighbours never change a row's tokens: greedy and seeded."""
    prompts = [f"prompt number {i} " * (1 + 3 * i) for i in range(6)]
    extras = [{"temperature": 0}, {"temperature": 0.9, "seed": 11}]
    alone = [[_ask(server.url, p, **x) for p in prompts] for x in extras]
    together: list[list[str | None]] = [[None] * len(prompts) for _ in extras]

    def go(j, i):
        together[j][i] = _ask(server.url, prompts[i], **extras[j])

    threads = [threading.Thread(target=go, args=(j, i)) for j in range(len(extras)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    stats = httpx.get(server.base + "/laplace/stats").json()
    assert any(int(w) > 1 for w in stats["width_histogram"]), stats  # they did share steps


def test_stop_strings_end_the_reply_before_them(server):
    full = _ask(server.url, "abc", temperature=0, max_tokens=24)
    cut = next(i for i in range(3, len(full)) if full[i:i + 2] not in full[:i])
    r = httpx.post(server.base + "/chat/completions", timeout=60, json={
        "model": "tiny", "temperature": 0, "max_tokens": 24, "stop": [full[cut:cut + 2]],
        "messages": [{"role": "user", "content": "abc"}]}).json()
    assert r["choices"][0]["message"]["content"] == full[:cut]
    assert r["choices"][0]["finish_reason"] == "stop"


def test_a_client_that_goes_away_cancels_its_reply_which_is_kept(db, endless):
    with running(db, endless) as server:
        body = {"model": "tiny", "temperature": 0, "max_tokens": 4000, "stream": True,
                "messages": [{"role": "user", "content": "go on forever"}]}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base + "/chat/completions", json=body) as r:
                uid = r.headers["x-laplace-session"]
                seen = 0
                for line in r.iter_lines():
                    seen += line.startswith("data:")
                    if seen > 20:
                        break
        deadline = time.monotonic() + 30
        while True:
            with server.store() as store:
                head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
            if head.status != "streaming" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert head.role == "assistant" and head.status == "cancelled" and head.content
        assert head.stats["stop_reason"] == "cancelled" and head.stats["new_tokens"] < 4000
        with server.store() as store:
            assert_stored_state_is_a_replay(store, endless, uid)
        # The lease went with it: the session answers again.
        again = httpx.post(server.base + "/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 4, "session": uid, "messages": [{"role": "user", "content": "still there?"}]})
        assert again.status_code == 200, again.text


def test_second_request_on_a_session_in_flight_gets_409(db, endless):
    with running(db, endless) as server:
        first = httpx.post(server.base + "/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        uid = first.json()["session"]
        body = {"model": "tiny", "temperature": 0, "max_tokens": 4000, "stream": True, "session": uid,
                "messages": [{"role": "user", "content": "long one"}]}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base + "/chat/completions", json=body) as r:
                assert r.status_code == 200, r.read()
                lines = r.iter_lines()  # held: dropping the iterator would close the stream
                next(lines)
                clash = http.post(server.base + "/chat/completions", json={
                    "model": "tiny", "max_tokens": 4, "session": uid, "messages": [{"role": "user", "content": "me too"}]})
        assert clash.status_code == 409 and clash.json()["error"]["code"] == "session_in_use"
        # Another process holding the session's lease: the store's own message, also 409.
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").json()["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
        other = SessionStore.open(db)
        try:
            other.leases.acquire(uid)
            held = httpx.post(server.base + "/chat/completions", timeout=60, json={
                "model": "tiny", "max_tokens": 4, "session": uid, "messages": [{"role": "user", "content": "x"}]})
            assert held.status_code == 409 and "in use by pid" in held.json()["error"]["message"]
        finally:
            other.close()


def test_an_error_mid_reply_is_stored_and_the_server_stays_up(server, monkeypatch):
    real, calls = server.writer.runner.step_, {"n": 0}

    def flaky(tokens, state):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fell over at /secret/path")
        return real(tokens, state)

    monkeypatch.setattr(server.writer.runner, "step_", flaky)
    r = httpx.post(server.base + "/chat/completions", timeout=60, json={
        "model": "tiny", "temperature": 0, "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
    assert "secret" not in r.text and "server's log" in r.json()["error"]["message"]  # the cause stays inside
    uid = r.json()["laplace"]["session"]
    with server.store() as store:
        head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
        assert head.status == "error" and head.error and "device fell over" in head.error
    again = httpx.post(server.base + "/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "session": uid, "messages": [{"role": "user", "content": "again"}]})
    assert again.status_code == 200 and again.json()["laplace"]["status"] == "complete"


def test_recall_refresh_applies_to_server_turns(server, lm):
    fact, chatter = "My locker code is 48213.", "Tell me about the garden, the river and the old mill by the bridge today, please."
    http = httpx.Client(base_url=server.base, timeout=60)
    first = http.post("/chat/completions", json={"model": "tiny", "max_tokens": 8, "laplace": {"options": {"refresh_horizon": 200}},
                                                  "messages": [{"role": "user", "content": fact}]}).json()
    uid = first["session"]
    for _ in range(3):
        http.post("/chat/completions", json={"model": "tiny", "max_tokens": 8, "session": uid,
                                             "messages": [{"role": "user", "content": chatter}]})
    question = {"model": "tiny", "max_tokens": 8, "session": uid,
                "messages": [{"role": "user", "content": "What is my locker code?"}]}
    asked = http.post("/chat/completions", json=question).json()
    recall = asked["laplace"]["recall"]
    assert recall is not None and "text" not in recall and recall["tokens"] > 0  # the transcript text only when asked
    asked = http.post("/chat/completions", json={**question, "laplace": {"recall_text": True}}).json()
    recall = asked["laplace"]["recall"]
    assert recall is not None and FACT_IN(recall["text"], fact)
    with server.store() as store:
        assert store.tree.get_turn(recall["turn_id"]).stats["kind"] == "recall"
        assert_stored_state_is_a_replay(store, lm, uid)


def FACT_IN(text: str, fact: str) -> bool:
    return fact in text
