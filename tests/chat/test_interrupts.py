"""Ctrl-C and kill -9 during a reply, with real processes: nothing committed is lost and
the state never disagrees with the transcript."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agent.runtime.checkpoint import load_model, save_model_dir
from agent.runtime.generation import EagerRunner
from agent.runtime.state import RecurrentState
from sessions import SessionError, SessionStore

LAPLACE = str(Path(sys.executable).with_name("laplace"))
LONG = ["-o", "max_new_tokens", "20000", "-o", "temperature", "0"]


@pytest.fixture
def endless(tmp_path) -> str:
    """The tiny model made to reply without end: its final norm keeps one channel, and the
    LM head reads it as +1 for "a", -1 for "b" and 0 for every other token, so one of the
    two always beats <|end|> (a logit pinned at 0 alone lost wherever every other logit was
    negative, and a reply could end before the test's Ctrl-C landed)."""
    lm = load_model("tiny")
    tok = lm.tokenizer
    with torch.no_grad():
        lm.model.norm.weight.zero_()
        lm.model.norm.weight[0] = 1.0
        head = lm.model.lm_head.weight
        head.zero_()
        head[tok.encode("a")[0], 0] = 1.0
        head[tok.encode("b")[0], 0] = -1.0
    return str(save_model_dir(lm, tmp_path / "endless"))


def _default_sigint() -> None:
    # A child inherits SIGINT ignored or blocked from the test process (a background shell
    # ignores it; a library may block it): then Ctrl-C never reaches its Python and the reply
    # runs to its end (exit 0). Twice in full runs (never alone) all three attempts did that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start_ask(home: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "LAPLACE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([LAPLACE, "ask", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)


def wait_streaming(db: Path, timeout: float = 60) -> None:
    """Until an assistant row is streaming with some text flushed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with SessionStore.open(db, readonly=True) as s:
                    rows = s.db.execute("SELECT count(*) FROM turns WHERE status = 'streaming' AND length(content) > 0").fetchone()
                    if rows[0]:
                        return
            except SessionError:  # the writer is still creating and migrating the file
                pass
        time.sleep(0.1)
    raise AssertionError("no reply started streaming")


def check_consistent(db: Path, model: str) -> None:
    """Every snapshot equals a fresh replay of the token ids stored up to its turn."""
    lm = load_model(model)
    runner = EagerRunner(lm.model, segment_len=64)
    with SessionStore.open(db, readonly=True) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for summary in s.browse.list_sessions():
            snap = s.states.latest(summary.session.id)
            stored = RecurrentState.from_bytes(s.states.load(snap, expected_fingerprint=lm.fingerprint))
            state = lm.model.new_state(1)
            for ids in s.tree.branch_token_ids(summary.session.id, snap.turn_id):
                if ids:
                    _, state = runner.prefill(ids, state)
            # Thousands of one-token decode steps against a chunked replay of the same tokens:
            # equal up to fp32 accumulation order (a wrong or missing token would differ by O(1)).
            torch.testing.assert_close(stored.gla, state.gla, rtol=1e-4, atol=1e-5)


def test_ctrl_c_mid_reply_saves_it_as_cancelled(tmp_path, endless):
    """A pinned logit of 0 still wins where every other one is negative, so a reply can
    end by itself before the signal lands (exit 0): then the next prompt, in a fresh home."""
    for attempt, prompt in enumerate(["tell me everything", "and then what happened", "go on, at length"]):
        home = tmp_path / f"home{attempt}"
        proc = start_ask(home, "-m", endless, *LONG, prompt)
        wait_streaming(home / "laplace.db")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            break
    assert proc.returncode == 130, err
    assert b"partial reply was saved" in err
    with SessionStore.open(home / "laplace.db", readonly=True) as s:
        uid = s.browse.list_sessions()[0].session.uid
        head = s.tree.tail(uid, 1)[0]
        assert head.role == "assistant" and head.status == "cancelled" and head.content
        assert s.states.latest(uid).turn_id == head.id  # the partial reply has its state
    check_consistent(home / "laplace.db", endless)


def test_kill_9_mid_reply_loses_nothing_committed(tmp_path, endless):
    home = tmp_path / "home"
    first = start_ask(home, "-m", endless, "-o", "max_new_tokens", "4", "a committed turn")
    assert first.wait(timeout=60) == 0
    proc = start_ask(home, "-c", *LONG, "this reply will be killed")
    wait_streaming(home / "laplace.db")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    again = start_ask(home, "-c", "-o", "max_new_tokens", "4", "after the crash")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    with SessionStore.open(home / "laplace.db", readonly=True) as s:
        uid = s.browse.list_sessions()[0].session.uid
        roles = [(t.role, t.status, t.content[:12]) for t in s.tree.branch(uid)]
    assert roles[1] == ("user", "complete", "a committed ")
    assert roles[3] == ("user", "complete", "this reply w")  # stored before generation began
    assert roles[4][:2] == ("assistant", "cancelled")  # interrupted, its text kept
    assert roles[5] == ("user", "complete", "after the cr") and roles[6][1] == "complete"
    # The next run folded the kept text into the state (the killed writer never stored its
    # token ids): the stored ids are exactly the template around the stored text.
    lm = load_model(endless)
    tok, tpl = lm.tokenizer, lm.template
    with SessionStore.open(home / "laplace.db", readonly=True) as s:
        killed = s.tree.branch(uid)[4]
        ids = s.tree.turn_token_ids(killed.id)
    assert killed.content and ids == [*tpl.reply_prefix(tok), *tok.encode(killed.content), *tpl.reply_suffix(tok)]
    check_consistent(home / "laplace.db", endless)


def test_second_process_on_the_same_session_is_refused(tmp_path, endless):
    home = tmp_path / "home"
    assert start_ask(home, "-m", endless, "-o", "max_new_tokens", "2", "hi").wait(timeout=60) == 0
    proc = start_ask(home, "-c", *LONG, "long reply")
    wait_streaming(home / "laplace.db")
    try:
        other = start_ask(home, "-c", "x")
        _, err = other.communicate(timeout=60)
        assert other.returncode == 1 and b"in use by pid" in err, err
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
