"""The real `laplace chat` in a real terminal: tmux sends keys and reads the screen.

New session, two turns, quit; `laplace chat -c` shows the old turns and runs on the stored
state (the status bar's token count is the stored head's, with no replay)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessions import SessionStore

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")
LAPLACE = str(Path(sys.executable).with_name("laplace"))


class Tmux:
    def __init__(self, home: Path) -> None:
        self.socket = f"laplace-test-{os.getpid()}"
        self.env = {**os.environ, "LAPLACE_HOME": str(home), "TERM": "xterm-256color"}

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=self.env).stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "chat", "-x", "120", "-y", "40", f"{command}; sleep 0.5")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-t", "chat", "-p")

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.screen())
            if m:
                return m
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never appeared; screen:\n{self.screen()}")

    def type_and_send(self, text: str) -> None:
        # One burst, as a paste or a fast typist delivers it: Enter must not overtake the
        # characters still queued before it (it did once, and submitted an empty prompt).
        self.tmux("send-keys", "-t", "chat", text, "Enter")

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "chat"], capture_output=True, env=self.env).returncode == 0

    def wait_gone(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"laplace did not quit; screen:\n{self.screen()}")
            time.sleep(0.2)

    def kill(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def term(tmp_path):
    t = Tmux(tmp_path / "home")
    yield t
    t.kill()


def test_two_turns_quit_and_continue(term, tmp_path):
    opts = "-o max_new_tokens 6 -o temperature 0"
    term.start(f"{LAPLACE} chat -m tiny {opts}")
    term.wait_for(r"tokens folded")
    term.type_and_send("first message")
    term.wait_for(r"tok/s")
    term.type_and_send("second message")
    term.wait_for(r"second message")
    deadline = time.monotonic() + 30
    store = SessionStore.open(tmp_path / "home" / "laplace.db", readonly=True)
    while time.monotonic() < deadline:  # wait for the second reply to be committed
        [summary] = store.browse.list_sessions()
        head = store.tree.tail(summary.session.id, 1)[0]
        if summary.turns == 4 and head.status == "complete":
            break
        time.sleep(0.2)
    assert summary.turns == 4 and head.role == "assistant" and head.status == "complete"
    term.tmux("send-keys", "-t", "chat", "C-q")
    term.wait_gone()

    term.start(f"{LAPLACE} chat -c")
    screen = term.wait_for(r"(\d[\d,]*) tokens folded").string
    folded = int(re.search(r"(\d[\d,]*) tokens folded", screen).group(1).replace(",", ""))
    assert "first message" in screen and "second message" in screen
    assert folded == head.tokens_total  # resumed on the stored state
    snap = store.states.latest(summary.session.id)
    assert snap.turn_id == head.id and snap.n_tokens == head.tokens_total
    term.tmux("send-keys", "-t", "chat", "C-q")
    term.wait_gone()
    store.close()
