"""`-o` through the console entry point (`agent.cli.main`, argv as the shell gives it).

`chat` and `ask` read `-o KEY VALUE` pairs; every other command's `-o` takes one value.
Rewriting the pairs once for the whole command line turned `sessions export -o out.md ID`
into `-o out.md=ID` ("Missing argument 'session_id'"), and broke `bench -o F` and
`finetune -o DIR` the same way, so each is run here through `main`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer

from agent.cli import main
from agent.settings import Settings
from sessions import SessionStore

TINY_TRAIN = ["-m", "tiny", "--seq-len", "32", "--batch-tokens", "64", "--steps", "1"]


def run_main(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["laplace", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    return done.value.code or 0


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LAPLACE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_sessions_export_takes_o_before_the_session_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Settings.from_env().ensure_home()
    with SessionStore.open(Settings.from_env().db_path) as store:
        uid = store.turns.create_session(model_id="tiny", system_prompt="be brief", system_token_ids=[1, 2]).uid
    out = tmp_path / "out.md"
    assert run_main(monkeypatch, "sessions", "export", "-o", str(out), uid[:8]) == 0
    assert "be brief" in out.read_text()


def test_bench_takes_o(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.bench

    monkeypatch.setattr(agent.bench, "registry", lambda: {"noop": lambda quick: {"summary": {"quick": quick}}})
    out = tmp_path / "bench.json"
    assert run_main(monkeypatch, "bench", "-o", str(out), "--quick", "noop") == 0
    assert json.loads(out.read_text())["results"] == {"noop": {"summary": {"quick": True}}}


def test_finetune_takes_o_before_its_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    data = tmp_path / "data.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "ft"
    assert run_main(monkeypatch, "finetune", "-o", str(out), str(data), *TINY_TRAIN) == 0, capsys.readouterr().err
    assert (out / "config.json").is_file()


def test_ask_still_takes_o_key_value_pairs(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    argv = ["ask", "-m", "tiny", "-o", "max_new_tokens", "3", "-o", "temperature", "0", "-o", "seed=4", "--json", "hi"]
    assert run_main(monkeypatch, *argv) == 0
    assert json.loads(capsys.readouterr().out)["new_tokens"] <= 3
    with SessionStore.open(Settings.from_env().db_path) as store:
        [item] = store.browse.list_sessions()
    assert item.session.options["max_new_tokens"] == 3 and item.session.options["seed"] == 4


def test_chat_still_takes_o_key_value_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.cli.chat as cli_chat

    seen: list[object] = []

    def opened(_settings: object, **kwargs: object) -> None:
        seen.append(kwargs["options"])
        raise typer.Exit(0)

    monkeypatch.setattr(cli_chat, "open_service", opened)
    assert run_main(monkeypatch, "chat", "-o", "temperature", "0.2", "-o", "stop=###", "-m", "tiny") == 0
    assert seen == [[("temperature", "0.2"), ("stop", "###")]]
