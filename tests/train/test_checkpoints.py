"""Fine-tuning checkpoints: optimizer state in safetensors (nothing unpickled), numbered
checkpoints kept newest-N, --stop-after, and --resume from the output directory or from one
checkpoint, each continuing exactly like an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner


from agent.cli import app
from agent.runtime.checkpoint import load_model
from agent.train import checkpoint as ckpt
from agent.train.checkpoint import ResumeError
from agent.train.config import TrainConfig, TrainConfigError
from agent.train.loop import Trainer


def _cfg(data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(data=(str(data),), out=str(out), steps=6, seq_len=32, batch_tokens=128, lr=3e-3, warmup=1)
    return TrainConfig(**{**base, **kw})


def _same_weights(a: Path, b: Path) -> None:
    x, y = load_model(str(a)).model.state_dict(), load_model(str(b)).model.state_dict()
    assert x.keys() == y.keys()
    for name in x:
        assert torch.equal(x[name], y[name]), name


@pytest.fixture
def whole(tmp_path: Path, text_dir: Path) -> Trainer:
    t = Trainer(_cfg(text_dir, tmp_path / "whole"))
    t.run()
    return t


def test_optimizer_state_is_safetensors_and_resume_never_unpickles(tmp_path: Path, text_dir: Path, whole: Trainer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    part = tmp_path / "part"
    Trainer(_cfg(text_dir, part, stop_after=3)).run()
    tdir = part / ckpt.TRAINER_DIR
    assert sorted(p.name for p in tdir.iterdir()) == ["optimizer.json", "optimizer.safetensors", "state.json"]
    index = json.loads((tdir / "optimizer.json").read_text())
    assert len(index["optimizers"]) == 2 and index["param_groups"][0][0]["lr"] > 0  # Muon + AdamW
    assert not list(tmp_path.rglob("*.pt"))

    def no_pickles(*a, **k):
        raise AssertionError("torch.load called on resume")

    monkeypatch.setattr(torch, "load", no_pickles)
    second = Trainer(_cfg(text_dir, part, resume=str(part)))
    second.run()
    assert second.start_step == 3
    assert [m["loss"] for m in second.history] == [m["loss"] for m in whole.history[3:]]
    _same_weights(tmp_path / "whole", part)


def test_a_version_1_pickle_checkpoint_is_refused_with_the_way_out(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "old"
    Trainer(_cfg(text_dir, out, steps=1)).run()
    state = out / ckpt.TRAINER_DIR / ckpt.STATE_FILE
    doc = json.loads(state.read_text())
    state.write_text(json.dumps({**doc, "format_version": 1}))
    with pytest.raises(ResumeError, match=f"torch pickle, which this version never loads; .*-m {out}"):
        Trainer(_cfg(text_dir, tmp_path / "new", resume=str(out))).run()


def test_save_every_keeps_the_newest_numbered_checkpoints(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "run"
    s = Trainer(_cfg(text_dir, out, save_every=1, keep=2)).run()
    assert s["completed"] and s["checkpoint"] == str(out)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("step-", ".step-"))) == ["step-000004", "step-000005"]
    assert load_model(str(out / "step-000004")).card["finetune_steps"] == 4  # each one is a model directory
    assert load_model(str(out)).card["finetune_steps"] == 6


def test_resume_from_one_older_checkpoint_matches_an_uninterrupted_run(tmp_path: Path, text_dir: Path, whole: Trainer) -> None:
    part = tmp_path / "part"
    first = Trainer(_cfg(text_dir, part, save_every=2, stop_after=5))
    s = first.run()
    assert not s["completed"] and s["steps"] == 5 and s["checkpoint"] == str(part)
    assert load_model(str(part)).card["finetune_steps"] == 5  # the output directory holds the latest model
    assert ckpt.resolve_resume(part) == part
    (part / "step-000004" / ckpt.TRAINER_DIR / ckpt.STATE_FILE).write_text(
        (part / ckpt.TRAINER_DIR / ckpt.STATE_FILE).read_text().replace('"step": 5', '"step": 6'))
    assert ckpt.resolve_resume(part) == part / "step-000004"  # the newest by step, wherever it is
    (part / "step-000004" / ckpt.TRAINER_DIR / ckpt.STATE_FILE).write_text(
        (part / ckpt.TRAINER_DIR / ckpt.STATE_FILE).read_text().replace('"step": 5', '"step": 4'))
    second = Trainer(_cfg(text_dir, part, save_every=2, resume=str(part / "step-000002")))
    second.run()
    assert [m["loss"] for m in first.history[:2] + second.history] == [m["loss"] for m in whole.history]
    _same_weights(tmp_path / "whole", part)
    # The abandoned continuation was set aside, not deleted, and metrics describe one run.
    assert sorted(p.name for p in part.iterdir() if "step-" in p.name) == [
        "abandoned-step-000004", "step-000002", "step-000004", "trainer-abandoned-step-000005"]
    steps = [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_stop_after_must_be_later_than_the_resumed_step(tmp_path: Path, text_dir: Path) -> None:
    Trainer(_cfg(text_dir, tmp_path / "r", stop_after=3)).run()
    with pytest.raises(TrainConfigError, match="--stop-after 2 is not after the resumed step 3"):
        Trainer(_cfg(text_dir, tmp_path / "r", resume=str(tmp_path / "r"), stop_after=2)).run()
    with pytest.raises(TrainConfigError, match="already holds a finetune run"):
        Trainer(_cfg(text_dir, tmp_path / "r")).run()  # numbered checkpoints count as a run
    with pytest.raises(TrainConfigError, match="--keep must be positive"):
        _cfg(text_dir, tmp_path / "k", keep=0)


runner = CliRunner()
BASE = ["-m", "tiny", "--seq-len", "32", "--batch-tokens", "128", "--lr", "3e-3", "--warmup", "1", "--steps", "6"]


def test_cli_stop_after_then_resume(tmp_path: Path, text_dir: Path, whole: Trainer) -> None:
    out = tmp_path / "cli"
    r = runner.invoke(app, ["finetune", str(text_dir), *BASE, "--out", str(out), "--stop-after", "4", "--keep", "1"])
    assert r.exit_code == 0, r.output
    assert "stopped at step 4 of 6" in r.output and f"continue with --resume {out}" in r.output
    r = runner.invoke(app, ["finetune", str(text_dir), *BASE, "--out", str(out), "--resume", str(out)])
    assert r.exit_code == 0, r.output
    assert "trained 6 steps" in r.output
    _same_weights(tmp_path / "whole", out)


def test_log_lines_quoting_file_names_carry_no_raw_escapes(tmp_path: Path, text_dir: Path) -> None:
    evil = text_dir / "bad\x1b]52;c;QQ==\x07[b].jsonl"
    evil.write_text('{"messages": 5}\n', encoding="utf-8")
    r = runner.invoke(app, ["finetune", str(text_dir), *BASE, "--steps", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "skipped bad record" in r.output and "␛]52;c;QQ==␇[b]" in r.output.replace("\n", "")  # rich wraps long lines
    assert "\x1b]52" not in r.output and "\x07" not in r.output
