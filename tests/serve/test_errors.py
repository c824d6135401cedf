"""Every bad input gets a 4xx in OpenAI's error shape with a one-line reason, and the
server stays up; limits answer 413 / 400 / 429 (with Retry-After); the bearer token."""

from __future__ import annotations

import json
import os
import threading

import httpx
import openai
import pytest

from agent.serve.protocol import Limits
from agent.serve.server import is_loopback, load_or_create_token
from sessions import SessionStore

from .conftest import running

OK = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def post(server, body=None, **kw) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \ud800, as a JavaScript client would send it
    return httpx.post(server.base + "/chat/completions", content=json.dumps(body), timeout=60,
                      headers={"content-type": "application/json", **kw.pop("headers", {})}, **kw)


def error_of(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "\n" not in err["message"]
    return err


@pytest.mark.parametrize("body, status, words", [
    ({**OK, "model": "gpt-4"}, 404, "does not exist here"),
    ({**OK, "session": "ffffffff"}, 404, "no session matches"),
    ({**OK, "session": "not-hex!"}, 404, "no session matches"),
    ({**OK, "session": 7}, 400, "session must be"),
    ({**OK, "messages": []}, 400, "non-empty list"),
    ({**OK, "messages": [{"role": "assistant", "content": "x"}]}, 400, "last message must be the user's"),
    ({**OK, "messages": [{"role": "tool", "content": "x"}]}, 400, "not supported"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "only text"),
    ({**OK, "messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                         {"role": "user", "content": "c"}]}, 400, "system messages must come first"),
    ({**OK, "messages": [{"role": "user", "content": "   "}]}, 400, "empty"),
    ({**OK, "messages": [{"role": "user", "content": "bad \ud800 text"}]}, 400,
     "the message is not valid UTF-8 text; re-encode it as UTF-8"),
    ({**OK, "max_tokens": 100_000}, 400, "max_tokens must be between 1 and 4096"),
    ({**OK, "max_tokens": 0}, 400, "max_tokens"),
    ({**OK, "temperature": -1}, 400, "temperature must be >= 0"),
    ({**OK, "temperature": "hot"}, 400, "temperature must be a number"),
    ({**OK, "top_p": 0}, 400, "top_p"),
    ({**OK, "n": 2}, 400, "n must be 1"),
    ({**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop must be"),
    ({**OK, "stream": "yes"}, 400, "stream must be"),
    ({**OK, "laplace": {"options": {"colour": 1}}}, 400, "unknown sampling option"),
    ({**OK, "tools": [{"type": "function"}]}, 400, "tools"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_requests_get_a_4xx_with_the_reason(server, body, status, words):
    r = post(server, body)
    assert r.status_code == status, r.text
    assert words in error_of(r)["message"]


JSON = {"content-type": "application/json"}


def test_malformed_and_non_utf8_bodies(server):
    r = httpx.post(server.base + "/chat/completions", content=b'{"model": "tiny", "messages": [', timeout=30, headers=JSON)
    assert r.status_code == 400 and "not valid JSON" in error_of(r)["message"]
    r = httpx.post(server.base + "/chat/completions", content=b'{"model": "tiny\xff"}', timeout=30, headers=JSON)
    assert r.status_code == 400 and "not UTF-8 text" in error_of(r)["message"]
    r = httpx.post(server.base + "/chat/completions", content=b"", timeout=30, headers=JSON)
    assert r.status_code == 400 and "empty" in error_of(r)["message"]


def test_unknown_routes_and_methods_are_json_too(server):
    r = httpx.get(server.url + "/v2/whatever")
    assert r.status_code == 404 and "no endpoint" in error_of(r)["message"]
    r = httpx.get(server.base + "/chat/completions")
    assert r.status_code == 405 and error_of(r)
    assert httpx.get(server.base + "/models/gpt-4").status_code == 404


def test_the_server_stays_up_after_every_bad_input(server):
    for body in ([1], {"model": "x"}, {**OK, "session": "00"}, {**OK, "max_tokens": -3}):
        post(server, body)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert post(server, OK).status_code == 200
    models = openai.OpenAI(base_url=server.base, api_key="x").models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_an_ambiguous_session_prefix_is_400_and_names_no_other_session(server):
    uids = [post(server, OK).json()["session"] for _ in range(2)]
    with SessionStore.open(server.db) as store:  # two ids that share their first 8 characters
        store.db.execute("UPDATE sessions SET uid = ? WHERE uid = ?", [uids[0][:8] + "f" * 24, uids[1]])
        store.db.commit()
    r = post(server, {**OK, "session": uids[0][:8]})
    message = error_of(r)["message"]
    assert r.status_code == 400 and "more than one session" in message
    assert uids[0][8:12] not in message and "ffff" not in message  # no id beyond what was sent
    r = post(server, {**OK, "session": uids[0][:3]})  # too short to be a capability
    assert r.status_code == 400 and "at least its first 8 characters" in error_of(r)["message"]
    assert post(server, {**OK, "session": uids[0]}).status_code == 200


def test_body_size_limit_is_413(db, lm):
    with running(db, lm, limits=Limits(max_body_bytes=2000)) as server:
        big = {**OK, "messages": [{"role": "user", "content": "x" * 5000}]}
        r = post(server, big)
        assert r.status_code == 413 and "larger than 2,000 bytes" in error_of(r)["message"]

        def chunks():  # no Content-Length: the limit holds on the stream too
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        r = httpx.post(server.base + "/chat/completions", content=chunks(), timeout=30, headers=JSON)
        assert r.status_code == 413
        assert post(server, OK).status_code == 200


def test_a_full_queue_is_429_with_retry_after(db, endless):
    with running(db, endless, widths=(1,), limits=Limits(max_queue=1)) as server:
        long = {"model": "tiny", "temperature": 0, "max_tokens": 3000, "stream": True,
                "messages": [{"role": "user", "content": "busy"}]}
        results: list[int] = []
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base + "/chat/completions", json=long) as r1:
                lines = r1.iter_lines()
                next(lines)  # it holds the only batch row
                waiter = threading.Thread(target=lambda: results.append(post(server, OK).status_code))
                waiter.start()
                while httpx.get(server.url + "/health").json()["pending"] < 1:
                    pass
                r = post(server, OK)
                assert r.status_code == 429 and "already waiting" in error_of(r)["message"]
                assert int(r.headers["retry-after"]) >= 1
        waiter.join(60)
        assert results == [200]  # the one that waited got its turn once the first went away


def test_bearer_token_when_configured(db, lm):
    with running(db, lm, token="s3cret") as server:
        assert post(server, OK).status_code == 401
        r = post(server, OK, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(server.base + "/models").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200
        good = openai.OpenAI(base_url=server.base, api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="tiny", messages=OK["messages"], max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base, api_key="nope", max_retries=0).models.list()


def test_token_file_is_private_and_reused(tmp_path):
    path = tmp_path / "home" / "serve-token"
    token, created = load_or_create_token(path)
    assert created and len(token) >= 40 and os.stat(path).st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)
    again, created = load_or_create_token(path)
    assert (again, created) == (token, False) and os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.0.0.2", True),
                                        ("0.0.0.0", False), ("192.168.1.5", False), ("::", False), ("example.com", False)])
def test_only_loopback_goes_without_a_token(host, loop):
    assert is_loopback(host) is loop


def test_the_server_s_max_tokens_caps_a_session_s_own_option(db, endless):
    with running(db, endless, limits=Limits(max_tokens=5)) as server:
        r = post(server, {"model": "tiny", "temperature": 0, "laplace": {"options": {"max_new_tokens": 9999}},
                          "messages": [{"role": "user", "content": "go"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert r.json()["choices"][0]["finish_reason"] == "length"
