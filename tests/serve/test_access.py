"""Who may reach the server: Host (DNS rebinding), browser Origins, JSON bodies and the
bearer token are decided by one middleware, for every route; no internal error text leaks."""

from __future__ import annotations

import time

import httpx
import pytest
from starlette.routing import Route

from agent.serve.access import AccessPolicy, host_name

from .conftest import running

OK = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route the app has, path parameters filled in."""
    out = []
    for r in app.routes:
        if isinstance(r, Route):
            for method in sorted(r.methods - {"HEAD"}):
                out.append((method, r.path.replace("{model:path}", "tiny")))
    return out


def test_a_rebound_host_is_refused_on_every_route(server):
    for method, path in [*routes(server.app), ("GET", "/nowhere")]:
        r = httpx.request(method, server.url + path, headers={"Host": "attacker.example:8080"}, json=OK)
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (method, path)
    port = server.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", f"app.localhost:{port}", f"[::1]:{port}"):
        assert httpx.get(server.base + "/models", headers={"Host": host}).status_code == 200, host


def test_a_form_post_is_not_json_and_is_refused(server):
    """A web page can POST text/plain across origins without a preflight: not here."""
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(server.base + "/chat/completions", content=b'{"model": "tiny"}', headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], kind
    r = httpx.post(server.base + "/chat/completions", json=OK, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_browser_origins_are_refused_unless_allowed(db, lm):
    with running(db, lm) as server:
        r = httpx.post(server.base + "/chat/completions", json=OK, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "--allow-origin" in r.json()["error"]["message"]
        assert httpx.get(server.url + "/health", headers={"Origin": "null"}).status_code == 403
    with running(db, lm, allow_origins=frozenset({"http://localhost:3000"})) as server:
        page = {"Origin": "http://localhost:3000"}
        pre = httpx.options(server.base + "/chat/completions", headers={
            **page, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = httpx.post(server.base + "/chat/completions", json=OK, headers=page)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-laplace-session" in r.headers["access-control-expose-headers"].lower()
        other = httpx.post(server.base + "/chat/completions", json=OK, headers={"Origin": "http://localhost:3001"})
        assert other.status_code == 403


def test_the_token_guards_every_route_but_the_open_ones(db, lm):
    """One allowlist, not a check repeated per handler: a route added later is guarded too."""
    with running(db, lm, token="s3cret") as server:
        for method, path in routes(server.app):
            r = httpx.request(method, server.url + path, json=OK)
            want = 200 if path == "/health" else 401
            assert r.status_code == want, (method, path)
        good = {"Authorization": "Bearer s3cret"}
        assert httpx.get(server.base + "/laplace/stats", headers=good).status_code == 200
        assert httpx.get(server.url + "/v2/anything").status_code == 401  # unknown paths too: nothing is learned


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_and_unexpected_errors_do_not_send_internal_text(db, lm, monkeypatch):
    with running(db, lm) as server:
        monkeypatch.setattr(server.scheduler.metrics, "snapshot", lambda: (_ for _ in ()).throw(
            RuntimeError("boom at /home/someone/secret.db")))
        r = httpx.get(server.base + "/laplace/stats")
        assert r.status_code == 500 and "secret" not in r.text and "boom" not in r.text
        assert "server's log" in r.json()["error"]["message"]
        monkeypatch.undo()

        def die():
            raise RuntimeError("scheduler died at /home/someone/secret.db")

        server.scheduler.on_step = die
        httpx.post(server.base + "/chat/completions", json=OK, timeout=30)  # wakes the loop, which dies
        deadline = time.monotonic() + 30
        while server.scheduler.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        assert "secret" not in health.text and "RuntimeError" not in health.text


@pytest.mark.parametrize("header, name", [("localhost:8080", "localhost"), ("[::1]:80", "::1"), ("::1", "::1"),
                                          ("Example.COM", "example.com"), ("10.0.0.5:1", "10.0.0.5")])
def test_host_names(header, name):
    assert host_name(header) == name


def test_a_wildcard_bind_answers_any_name_and_a_specific_one_only_its_own():
    wild = AccessPolicy(bound="0.0.0.0", token="t")
    assert wild.host_allowed("myhost.lan:8080") and wild.host_allowed("192.168.1.9")
    one = AccessPolicy(bound="192.168.1.9", token="t", allow_hosts=frozenset({"box.lan"}))
    assert one.host_allowed("192.168.1.9:8080") and one.host_allowed("box.lan") and one.host_allowed("localhost")
    assert not one.host_allowed("evil.example") and not one.host_allowed("192.168.1.10") and not one.host_allowed(None)
