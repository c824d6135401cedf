"""One sampling loop: the same session, seed and options give the same tokens through
`laplace chat` (ChatService) and `laplace serve`; the limits that bound one request's work."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from agent.chat.service import ChatService
from agent.runtime.generation import EagerRunner
from agent.runtime.reply import PROMPT_TAIL, StopStrings
from agent.serve.protocol import MAX_STOP_CHARS, Limits
from sessions import SessionStore

from .conftest import running

OPTIONS = {"temperature": 0.8, "top_k": 5, "repetition_penalty": 1e6, "seed": 7}  # top 5: never a penalized token
MESSAGE = "tell me about the river and the mill, the river and the mill"


def copy_db(src: Path, dst: Path) -> Path:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    return dst


def test_chat_and_serve_pick_the_same_tokens_for_the_same_session_seed_and_options(tmp_path, endless):
    db = tmp_path / "a.db"
    with running(db, endless) as server:  # a session with some history, made through the server
        uid = httpx.post(server.base + "/chat/completions", timeout=60, json={
            "model": "tiny", "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]}).json()["session"]
    chat_db = copy_db(db, tmp_path / "chat.db")
    with running(db, endless) as server:
        r = httpx.post(server.base + "/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 24, "session": uid, **OPTIONS,
            "messages": [{"role": "user", "content": MESSAGE}]})
        assert r.status_code == 200, r.text
    store = SessionStore.open(chat_db)
    svc = ChatService(store, endless, model_id="tiny", runner=EagerRunner(endless.model, segment_len=32),
                      options={**OPTIONS, "max_new_tokens": 24})
    try:
        svc.resume(uid)
        list(svc.send(MESSAGE))
        chat_head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
        chat_ids = store.tree.turn_token_ids(chat_head.id)
        user_ids = store.tree.turn_token_ids(chat_head.parent_id)
    finally:
        svc.close()
        store.close()
    with SessionStore.open(db, readonly=True) as served:
        head = served.tree.get_turn(served.core.get_session(uid).head_turn_id)
        served_ids = served.tree.turn_token_ids(head.id)
        assert head.content == chat_head.content and head.stats["stop_reason"] == chat_head.stats["stop_reason"]
    assert served_ids == chat_ids and len(chat_ids) > 24
    # The penalty saw the prompt's tail (the message) as well as the reply: with a penalty
    # this large, no token of the message comes back in the reply.
    prefix = endless.template.reply_prefix(endless.tokenizer)
    reply = chat_ids[len(prefix):len(prefix) + 24]
    assert not set(reply) & set(user_ids[-PROMPT_TAIL:]) and len(set(reply)) == len(reply)


def test_a_prompt_over_the_limit_is_400_naming_the_limit(db, lm):
    with running(db, lm, limits=Limits(max_prompt_tokens=60)) as server:
        def post(**body):
            return httpx.post(server.base + "/chat/completions", timeout=60, json={"model": "tiny", "max_tokens": 2, **body})

        r = post(messages=[{"role": "user", "content": "x" * 100}])
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded"
        assert "at most 60 per request" in err["message"] and "--max-prompt-tokens" in err["message"]
        r = post(messages=[{"role": "system", "content": "s" * 30}, {"role": "user", "content": "a" * 20},
                           {"role": "assistant", "content": "b" * 20}, {"role": "user", "content": "hi"}])
        assert r.status_code == 400  # a new session's system prompt and history count too
        first = post(messages=[{"role": "user", "content": "hi"}])
        assert first.status_code == 200
        again = post(session=first.json()["session"], messages=[{"role": "system", "content": "s" * 500},
                                                                 {"role": "user", "content": "more"}])
        assert again.status_code == 200  # a continued session reads only its new message
        stats = httpx.get(server.base + "/laplace/stats").json()
        assert stats["limits"]["max_prompt_tokens"] == 60 and stats["limits"]["max_stop_chars"] == MAX_STOP_CHARS


def test_stop_strings_are_capped(server):
    r = httpx.post(server.base + "/chat/completions", timeout=60, json={
        "model": "tiny", "stop": ["x" * (MAX_STOP_CHARS + 1)], "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and f"at most {MAX_STOP_CHARS} characters" in r.json()["error"]["message"]


def brute(text: str, stops: list[str]) -> tuple[int | None, int]:
    """The first stop string's start (by where it completes) and the longest held-back tail."""
    for end in range(1, len(text) + 1):
        hits = [end - len(s) for s in stops if end >= len(s) and text[end - len(s):end] == s]
        if hits:
            return min(hits), 0
    held = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return None, held


@pytest.mark.parametrize("seed", range(30))
def test_stop_strings_match_a_brute_force_search(seed):
    import random

    rng = random.Random(seed)
    stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
    text = "".join(rng.choice("abc") for _ in range(40))
    matcher, at, cut = StopStrings(stops), 0, None
    while at < len(text) and cut is None:
        piece = text[at:at + rng.randint(1, 4)]
        cut = matcher.feed(piece)
        at += len(piece)
    seen = text[:matcher.fed]
    want_cut, want_held = brute(seen, stops)
    assert cut == want_cut
    if cut is None:
        assert matcher.held == want_held


def test_stop_checking_costs_the_new_text_not_the_reply():
    """Long stop strings and a long reply: each token's check is O(its text), not O(reply x stop)."""
    stops = ["a" * (MAX_STOP_CHARS - 1) + b for b in "bcde"]
    matcher = StopStrings(stops)
    t0 = time.process_time()
    for _ in range(20_000):
        assert matcher.feed("a") is None
    assert matcher.held == MAX_STOP_CHARS - 1
    assert time.process_time() - t0 < 2.0  # ~0.1 s; an O(len(stop)^2) check per token takes minutes
    assert matcher.feed("c") == 20_000 - (MAX_STOP_CHARS - 1)
