"""`laplace finetune` end to end: a run recorded in the database, one-line errors for bad
input, and the torchrun entry point's argument round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner


from agent.cli import app
from agent.runtime.checkpoint import load_model, save_model_dir
from agent.settings import Settings
from agent.train.__main__ import config_to_argv, parse_config
from agent.train.config import TrainConfig

runner = CliRunner()
BASE = ["-m", "tiny", "--seq-len", "32", "--batch-tokens", "64", "--lr", "3e-3"]


def _invoke(*args: str):
    return runner.invoke(app, ["finetune", *args])


def test_finetune_saves_a_model_and_records_the_run(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "ft"
    r = _invoke(str(text_dir), *BASE, "--out", str(out), "--steps", "3", "--eval", str(text_dir / "a.txt"))
    assert r.exit_code == 0, r.output
    assert "trained 3 steps" in r.output and "eval loss" in r.output
    assert load_model(str(out)).card["finetune_steps"] == 3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    from sessions.store import SessionStore

    with SessionStore.open(Settings.from_env().db_path) as store:
        runs = store.browse.list_finetune_runs()
    assert len(runs) == 1 and runs[0].payload["steps"] == 3 and runs[0].kind == "finetune-all"


def _broken_model(tmp_path: Path) -> Path:
    d = save_model_dir(load_model("tiny"), tmp_path / "broken")
    (d / "tokenizer.json").unlink()
    return d


@pytest.mark.parametrize(
    "make_args, match",
    [
        (lambda t, d: [str(t / "empty")], "no data files"),
        (lambda t, d: [str((t / "x.csv").write_text("a") and t / "x.csv")], "unknown data format"),
        (lambda t, d: [str(d), "-m", str(_broken_model(t))], "missing tokenizer.json"),
        (lambda t, d: [str(d), "--lr", "3"], "out of range"),
        (lambda t, d: [str(d), "--resume", str(_other_run(t, d))], "another model"),
        (lambda t, d: [str(d), "--seq-len", "20"], "multiple of the model's chunk"),
    ],
    ids=["empty-data", "unknown-format", "model-missing-files", "lr-out-of-range", "resume-other-model", "seq-len"],
)
def test_bad_input_is_one_error_line(tmp_path: Path, text_dir: Path, make_args, match: str) -> None:
    (tmp_path / "empty").mkdir()
    args = make_args(tmp_path, text_dir)
    r = _invoke(*BASE, *args, "--out", str(tmp_path / "o"), "--steps", "1")  # the later option wins
    assert r.exit_code == 1, r.output
    assert match in r.stderr and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.output


def _other_run(tmp_path: Path, data: Path) -> Path:
    """A finished run whose base is another model (seed 3) with the tiny shape."""
    other = save_model_dir(load_model("tiny", seed=3), tmp_path / "other-base")
    out = tmp_path / "other-run"
    r = _invoke(str(data), "-m", str(other), *BASE[2:], "--out", str(out), "--steps", "1")
    assert r.exit_code == 0, r.output
    return out


def test_torchrun_argv_round_trips() -> None:
    cfg = TrainConfig(data=("a", "b"), out="o", base="tiny", tokens=1000, lr=1e-3, eval=("e",), schedule="cosine", tune="state")
    back, models_dir = parse_config(config_to_argv(cfg, Path("/m")))
    assert back == cfg and models_dir == Path("/m")


@pytest.mark.slow
def test_distributed_flag_runs_torchrun(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "dist"
    r = _invoke(str(text_dir), *BASE, "--batch-tokens", "128", "--out", str(out), "--steps", "2", "--distributed", "--nproc-per-node", "2")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "summary.json").read_text())["world"] == 2
    assert load_model(str(out)).card["finetune_steps"] == 2
