"""The shared progress line (agent.cli.errors.progress_line, which the default model's
download bar and chat's fold bars draw with): redrawn in place on a terminal, a plain line
now and then in a file or pipe, never a carriage return per update."""

from __future__ import annotations

import pytest

from agent.cli import errors
from agent.cli.models import _bar


def _drive(total_mb: int = 500) -> None:
    mb = 1 << 20
    for done in range(0, total_mb * mb, mb):  # one update per megabyte, as the download makes
        _bar("downloading the teacher (once)", done, total_mb * mb)
    _bar("downloading the teacher (once)", total_mb * mb, total_mb * mb)


def test_in_a_pipe_a_bar_is_a_few_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    _drive()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert 2 <= len(lines) <= 12, lines  # the start, every tenth, the end
    assert "[" + "." * 30 + "]" in lines[0] and "[" + "#" * 30 + "]" in lines[-1]


def test_on_a_terminal_it_is_redrawn_in_place(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_stderr_is_terminal", lambda: True)
    for done in range(5):
        errors.progress_line("folding", done, 4)
    err = capsys.readouterr().err
    assert err.count("\r") == 5 and err.endswith("4/4\n") and err.count("\n") == 1
