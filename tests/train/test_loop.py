"""The training loop on the tiny preset: learning, checkpoints that load, exact resume,
refusals, and --tune state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.runtime.checkpoint import load_model
from agent.runtime.state import StateModelMismatchError
from agent.train.checkpoint import ResumeError
from agent.train.config import TrainConfig, TrainConfigError
from agent.train.initial_state import INITIAL_STATE_FILE, load_initial_state
from agent.train.loop import Trainer, train


def _cfg(data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(data=(str(data),), out=str(out), steps=6, seq_len=32, batch_tokens=128, lr=3e-3, warmup=1)
    return TrainConfig(**{**base, **kw})


def test_training_lowers_loss_and_writes_a_loadable_model(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "run"
    s = train(_cfg(text_dir, out, steps=8, eval=(str(text_dir / "a.txt"),), eval_every=4))
    assert s["eval_loss"] < s["eval_loss_start"] - 0.5
    assert s["completed"] and s["tokens"] == 8 * 128
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 9)) and "eval_loss" in lines[3]
    loaded = load_model(str(out))  # what `laplace chat -m DIR` does
    assert loaded.card["base"] == "tiny" and loaded.card["finetune_steps"] == 8
    base = load_model("tiny")
    assert not torch.equal(loaded.model.lm_head.weight, base.model.lm_head.weight)


def test_resume_continues_exactly(tmp_path: Path, text_dir: Path) -> None:
    whole = Trainer(_cfg(text_dir, tmp_path / "whole"))
    whole.run()
    first = Trainer(_cfg(text_dir, tmp_path / "part", stop_after=3))
    s1 = first.run()
    assert s1["steps"] == 3 and not s1["completed"]
    second = Trainer(_cfg(text_dir, tmp_path / "part", resume=str(tmp_path / "part")))
    second.run()
    losses = [m["loss"] for m in first.history + second.history]
    assert losses == [m["loss"] for m in whole.history]  # bit-identical curve
    a, b = load_model(str(tmp_path / "whole")), load_model(str(tmp_path / "part"))
    for (n, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y), n


def test_resume_reapplies_command_line_learning_rates(tmp_path: Path, text_dir: Path) -> None:
    train(_cfg(text_dir, tmp_path / "r", stop_after=2, schedule="constant"))
    t = Trainer(_cfg(text_dir, tmp_path / "r", resume=str(tmp_path / "r"), lr=1e-4, schedule="constant"))
    t.run()
    assert all(g["lr"] == pytest.approx(1e-4) for opt in t.opts for g in opt.param_groups)


def test_resume_refuses_other_models_and_non_runs(tmp_path: Path, text_dir: Path) -> None:
    train(_cfg(text_dir, tmp_path / "r", steps=1))
    other = load_model("tiny", seed=7)  # same shape, other weights
    with pytest.raises(ResumeError, match="another model"):
        Trainer(_cfg(text_dir, tmp_path / "r2", resume=str(tmp_path / "r")), base=other).run()
    with pytest.raises(ResumeError, match="not the --out directory"):
        Trainer(_cfg(text_dir, tmp_path / "r3", resume=str(text_dir))).run()
    with pytest.raises(TrainConfigError, match="already holds a finetune run"):
        train(_cfg(text_dir, tmp_path / "r", steps=1))


def test_adamw_only_baseline_has_no_muon(tmp_path: Path, text_dir: Path) -> None:
    t = Trainer(_cfg(text_dir, tmp_path / "a", steps=2, optimizer="adamw"))
    s = t.run()
    assert s["muon_parameters"] == 0 and len(t.opts) == 1


def test_chat_data_trains_only_on_replies(tmp_path: Path, chat_file: Path) -> None:
    t = Trainer(_cfg(chat_file, tmp_path / "c", steps=2))
    t.run()
    _, labels = t.data.rows(torch.arange(len(t.data)))
    frac = float((labels != -100).float().mean())
    assert 0.05 < frac < 0.3  # answers and end tokens, not the questions


def test_tune_state_learns_one_state_and_saves_it_for_chat(tmp_path: Path, text_dir: Path) -> None:
    base = load_model("tiny")
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    out = tmp_path / "st"
    s = Trainer(_cfg(text_dir, out, tune="state", steps=5, lr=0.05, eval=(str(text_dir / "a.txt"),)), base=base).run()
    assert s["eval_loss"] < s["eval_loss_start"]
    assert s["adamw_parameters"] == base.config.state_bytes() // 4  # exactly one state's size
    assert all(torch.equal(before[k], v) for k, v in base.model.state_dict().items())  # model untouched
    state = load_initial_state(out / INITIAL_STATE_FILE, base)
    assert state.gla.shape == (2, 1, 4, 16, 32) and state.gla.abs().sum() > 0
    with pytest.raises(StateModelMismatchError):
        load_initial_state(out, load_model("tiny", seed=5))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lr=5.0), "out of range"),
        (dict(lr=0.0), "out of range"),
        (dict(steps=None), "exactly one of"),
        (dict(schedule="linear"), "not one of"),
        (dict(tune="state", distributed=True), "single process"),
    ],
    ids=["lr-high", "lr-zero", "no-budget", "schedule", "state-distributed"],
)
def test_bad_options_fail_before_any_work(tmp_path: Path, kw, match: str) -> None:
    with pytest.raises(TrainConfigError, match=match):
        _cfg(tmp_path, tmp_path / "o", **kw)


def test_seq_len_must_be_a_multiple_of_the_chunk(tmp_path: Path, text_dir: Path) -> None:
    with pytest.raises(TrainConfigError, match="multiple of the model's chunk"):
        train(_cfg(text_dir, tmp_path / "o", seq_len=40))
