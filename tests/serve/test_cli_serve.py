"""`laplace serve`'s flags are refused with one line before anything loads or binds."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from agent.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args, words", [
    (["--widths", "0,2"], "positive batch widths"),
    (["--widths", "a,b"], "comma-separated"),
    (["--widths", "1,2,3,4,5,6,7,8,9"], "at most 8 shapes"),
    (["--max-queue", "-1"], "--max-queue at least 0"),
    (["-o", "colour", "red"], "unknown sampling option"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be at least 1"),
    (["--allow-origin", "evil.example"], "--allow-origin takes an origin like http://localhost:3000"),
])
def test_bad_flags_fail_with_one_line(args, words):
    res = runner.invoke(app, ["serve", "-m", "tiny", "--port", "0", *args])
    assert res.exit_code == 1 and words in res.output and res.output.startswith("error: ")


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = runner.invoke(app, ["serve", "-m", "tiny", "--port", str(port)])
    assert res.exit_code == 1 and "cannot listen on 127.0.0.1" in res.output
