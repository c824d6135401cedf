"""kill -9 of `laplace serve` mid-stream: no committed turn is lost, and the session resumes
(the interrupted reply kept, marked cancelled, folded into the state) on the next server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent.runtime.checkpoint import save_model_dir
from sessions import SessionStore

from .conftest import assert_stored_state_is_a_replay

ROOT = Path(__file__).resolve().parents[2]


def start(home: Path, model: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "LAPLACE_HOME": str(home), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from agent.cli import main; main()", "serve", "-m", model,
                             "--port", "0"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if match:
            url = match.group(1)
            while time.monotonic() < deadline:  # bound; wait for the app's start-up
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        return proc, url
                except httpx.TransportError:
                    time.sleep(0.1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"laplace serve did not start: {proc.stderr.read()}")


def test_sigkill_mid_stream_loses_no_committed_turn_and_the_session_resumes(tmp_path, endless):
    model = str(save_model_dir(endless, tmp_path / "endless"))
    home = tmp_path / "home"
    db = home / "laplace.db"
    proc, url = start(home, model)
    try:
        done = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": model, "temperature": 0, "max_tokens": 12, "messages": [{"role": "user", "content": "first"}]}).json()
        uid = done["session"]
        committed = done["laplace"]["assistant_turn_id"]
        body = {"model": model, "temperature": 0, "max_tokens": 4000, "stream": True, "session": uid,
                "messages": [{"role": "user", "content": "now talk for a long time"}]}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # until some of the reply was flushed to SQLite
                    next(lines)
                    with SessionStore.open(db, readonly=True) as s:
                        if s.db.execute("SELECT count(*) FROM turns WHERE status = 'streaming' AND length(content) > 0"
                                        ).fetchone()[0]:
                            break
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with SessionStore.open(db, readonly=True) as store:
        turn = store.tree.get_turn(committed)
        assert (turn.status, turn.content) == ("complete", done["choices"][0]["message"]["content"])
        assert store.states.latest(uid, committed).turn_id == committed
        head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
        assert head.role == "assistant" and head.status == "streaming" and head.content  # the kill left it so
        interrupted = head.id
    proc, url = start(home, model)
    try:
        again = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": model, "temperature": 0, "max_tokens": 6, "session": uid,
            "messages": [{"role": "user", "content": "are you back?"}]})
        assert again.status_code == 200, again.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its graceful shutdown
    with SessionStore.open(db, readonly=True) as store:
        kept = store.tree.get_turn(interrupted)
        assert kept.status == "cancelled" and kept.content and kept.n_tokens > 0  # kept and folded
        branch = store.tree.branch(uid)
        assert [(t.role, t.status) for t in branch][-3:] == [("assistant", "cancelled"), ("user", "complete"),
                                                             ("assistant", "complete")]
        assert store.leases.holder(uid) is None  # the stopped server left no lease behind
        assert_stored_state_is_a_replay(store, endless, uid)
