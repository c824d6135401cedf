"""`laplace sessions ...` through typer's CliRunner: exit codes, output, rows written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.settings import Settings
from sessions import SessionStore

from .conftest import converse, tokens_of

runner = CliRunner()


def run(*args: str, input: str | None = None):
    return runner.invoke(app, ["sessions", *args], input=input)


@pytest.fixture
def two_sessions() -> list[str]:
    with SessionStore.open(Settings.from_env().db_path) as store:
        a = store.turns.create_session(model_id="tiny", system_token_ids=tokens_of("s"), name="alpha")
        converse(store, a.id, "the quick brown fox", size=29_491)
        b = store.turns.create_session(model_id="tiny", name="beta")
        return [a.uid, b.uid]


def test_list_table_and_json(two_sessions: list[str]) -> None:
    res = run("list")
    assert res.exit_code == 0, res.output
    assert "alpha" in res.output and two_sessions[0][:8] in res.output and "29.5 kB" in res.output
    rows = json.loads(run("list", "--json").output)
    assert [r["name"] for r in rows] == ["beta", "alpha"]
    alpha = rows[1]
    assert (alpha["turns"], alpha["state_bytes"], alpha["tokens_folded"]) == (2, 29_491, alpha["tokens_folded"])
    assert alpha["tokens_folded"] == len(tokens_of("s")) + len(tokens_of("the quick brown fox")) + len(
        tokens_of("re: the quick brown fox"))


def test_empty_list_creates_a_private_db() -> None:
    res = run("list")
    assert res.exit_code == 0 and "no sessions yet" in res.output
    assert Settings.from_env().db_path.stat().st_mode & 0o777 == 0o600


def test_show_rename_archive(two_sessions: list[str]) -> None:
    uid = two_sessions[0]
    res = run("show", uid[:5])
    assert res.exit_code == 0 and "retention: latest snapshot per branch + 2 older" in res.output
    assert "the quick brown fox" in res.output
    data = json.loads(run("show", uid[:5], "--json").output)
    assert data["retention"] == {"keep_latest_per_branch": 1, "keep_older": 2} and len(data["snapshots"]) == 1
    assert run("rename", uid[:5], "renamed").exit_code == 0
    assert run("retention", uid[:5], "0").exit_code == 0
    assert json.loads(run("show", uid, "--json").output)["keep_snapshots"] == 0
    assert run("archive", uid[:5]).exit_code == 0
    assert [r["name"] for r in json.loads(run("list", "--json").output)] == ["beta"]
    assert "renamed" in run("list", "--all").output


def test_rm_asks_unless_yes(two_sessions: list[str]) -> None:
    uid = two_sessions[1]
    res = run("rm", uid[:6], input="n\n")
    assert res.exit_code == 1 and len(json.loads(run("list", "--json").output)) == 2
    res = run("rm", uid[:6], input="y\n")
    assert res.exit_code == 0 and "deleted" in res.output
    assert run("rm", two_sessions[0], "--yes").exit_code == 0
    assert json.loads(run("list", "--json").output) == []


def test_fork_export_search(two_sessions: list[str], tmp_path: Path) -> None:
    res = run("fork", two_sessions[0][:6], "--name", "copy")
    assert res.exit_code == 0
    new_uid = res.output.strip()
    md = run("export", new_uid[:8])
    assert md.exit_code == 0 and md.output.startswith("# copy") and "the quick brown fox" in md.output
    out = tmp_path / "s.json"
    assert run("export", new_uid[:8], "--format", "json", "-o", str(out)).exit_code == 0
    assert [m["role"] for m in json.loads(out.read_text())["messages"]] == ["user", "assistant"]  # empty system prompt left out
    hits = json.loads(run("search", "brown fox", "--json").output)
    assert {h["session"] for h in hits} == {two_sessions[0], new_uid}
    assert "«brown»" in run("search", "brown").output
    assert "no matches" in run("search", "nothing-like-this").output


def test_errors_are_one_line_and_exit_1(two_sessions: list[str]) -> None:
    for args in (["show", "ffffffffff"], ["rename", "zz", "x"], ["show", ""]):
        res = run(*args)
        assert res.exit_code == 1
        lines = [l for l in res.output.splitlines() if l]
        assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "unknown format" in run("export", two_sessions[0], "-f", "pdf").output


def test_cli_module_does_not_import_torch() -> None:
    code = "import sys, agent.cli.sessions, sessions; sys.exit(int(any(m in sys.modules for m in ('torch', 'textual'))))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
