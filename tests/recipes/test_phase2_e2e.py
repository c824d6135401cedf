"""The recipe's phases 2-5 end to end on the tiny preset: `--from-model` -> model directory + card."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.runtime.checkpoint import load_model, load_model_dir, save_model_dir


@pytest.mark.slow
def test_phase2_from_a_model_directory_writes_a_loadable_model_with_its_card(tmp_path: Path) -> None:
    start = tmp_path / "phase1"
    save_model_dir(load_model("tiny"), start)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recipes.default_model.build_default", "--from-model", str(start), "--phase2-steps", "2",
           "--phase2-polish-steps", "2", "--phase3-steps", "2", "--phase4-lookup-steps", "1", "--phase4-mix-steps", "1", "--phase4-steps", "2", "--phase5-steps", "0",
           "--phase5-long-steps", "0", "--eval-trials", "1", "--work", str(tmp_path / "work"), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    lm = load_model_dir(out)
    card = lm.card
    assert card["phase2"]["steps"] == 2 and card["phase2"]["polish_steps"] == 2 and card["phase2"]["best_validation_step"] == 2
    assert card["phase3"] == {"steps": 2}
    assert card["phase4"] == {"steps": 4, "lookup": 1, "mix": 1, "bridge": 2}
    assert card["training_tokens"] == (2 + 2 + 2 + 1 + 1 + 2) * 4096
    stages = card["stages"]
    assert stages[0]["phase"] == 1 and stages[0]["from_model"] == str(start)
    assert stages[1]["block"] == "rows512" and "validation" in stages[1]
    assert stages[2]["block"] == "polish" and stages[2]["steps"] == [0, 2]
    assert stages[3]["phase"] == 3 and stages[3]["data"]["never"] > 0 and stages[3]["data"]["text_chars"] > 0
    assert [(h["phase"], h["block"], h["steps"], h["planned_steps"]) for h in stages[4:]] == [
        (4, "lookup", [0, 1], 1), (4, "mix", [0, 1], 3), (4, "bridge", [0, 2], 2)]
    assert stages[6]["checks"][-1]["step"] == 2 and 0 <= stages[6]["checks"][-1]["two_codes_right"] <= 1
    assert stages[6]["data"]["lookup_records"] > 0 and stages[6]["data"]["key_drill_tokens"] > 0
    ev = json.loads((tmp_path / "work" / "eval.json").read_text())
    assert set(ev["recall"]["recall_5digit"]) == {"0", "64", "128", "256", "512", "1024", "2048"}

    # Phase 3 alone on that output (its card folded as `card.py` does): the history goes on
    # from the given model's own stages.
    subprocess.run([sys.executable, "-m", "recipes.default_model.card", "--model", str(out), "--work", str(tmp_path / "work")],
                   check=True, capture_output=True, timeout=300)
    again = tmp_path / "again"
    cmd = [sys.executable, "-m", "recipes.default_model.build_default", "--from-model", str(out), "--phase2-steps", "0",
           "--phase3-steps", "3", "--phase4-steps", "0", "--phase5-steps", "0", "--phase5-long-steps", "0", "--eval-trials", "1",
           "--work", str(tmp_path / "work2"), "--out", str(again)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    card2 = load_model_dir(again).card
    assert card2["training_tokens"] == (2 + 2 + 2 + 4 + 3) * 4096 and card2["phase2"] == card["phase2"]
    assert [h.get("phase") for h in card2["stages"]] == [1, 2, 2, 3, 4, 4, 4, 3]


@pytest.mark.slow
def test_phase5_from_a_model_directory_adds_its_blocks_and_checks(tmp_path: Path) -> None:
    start = tmp_path / "start"
    save_model_dir(load_model("tiny"), start)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recipes.default_model.build_default", "--from-model", str(start), "--phase2-steps", "0",
           "--phase3-steps", "0", "--phase5-bind-steps", "1", "--phase5-decide-steps", "1", "--phase5-decide-keys", "real", "--phase5-steps", "2",
           "--phase5-long-steps", "1", "--phase5-far-steps", "1", "--phase5-wide-steps", "1", "--eval-trials", "1",
           "--work", str(tmp_path / "work"), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    shipped = load_model_dir(out)
    card = shipped.card
    assert card["phase5"] == {"steps": 7, "bind": 1, "decide": 1, "mix": 2, "long": 1, "far": 1, "wide": 1}
    assert card["training_tokens"] == 7 * 4096
    assert (shipped.config.head_k_dim, shipped.config.head_v_dim) == (64, 64)  # the wide block widened tiny's 16 x 32 heads
    blocks = [h for h in card["stages"] if h.get("phase") == 5]
    assert [(h["block"], h["steps"], h["rows"], h["focus_only"], h["data"]["keys"]) for h in blocks] == [
        ("bind", [0, 1], 256, True, "fragment"), ("decide", [0, 1], 512, True, "real"), ("mix", [0, 2], 512, False, "fragment"),
        ("long", [0, 1], 1024, False, "fragment"), ("far", [0, 1], 1024, False, "fragment"), ("wide", [0, 1], 1024, False, "fragment")]
    assert "not_told" not in blocks[0]["checks"][-1] and 0 <= blocks[0]["checks"][-1]["refusal_auc"] <= 1
    assert blocks[2]["checks"][-1]["step"] == 2 and 0 <= blocks[2]["checks"][-1]["not_told"] <= 1
    assert blocks[0]["data"]["key_drill_tokens"] > 0 and blocks[2]["data"]["phase3_tokens"] > 0
    assert not (tmp_path / "work" / "phase5_mix_data").exists()  # rebuilt from the seed when needed


@pytest.mark.parametrize("args, message", [
    (["--from-model", "/nonexistent/model"], "--from-model: model directory /nonexistent/model does not exist"),
    (["--phase2-steps", "-1"], "--phase2-steps must be >= 0"),
    (["--phase2-polish-steps", "-5"], "--phase2-polish-steps must be >= 0"),
    (["--phase3-steps", "-2"], "--phase3-steps must be >= 0"),
    (["--phase4-steps", "-1"], "--phase4-steps must be >= 0"),
    (["--phase4-lookup-steps", "-3"], "--phase4-lookup-steps must be >= 0"),
    (["--phase4-mix-steps", "-4"], "--phase4-mix-steps must be >= 0"),
    (["--phase5-steps", "-1"], "--phase5-steps must be >= 0"),
    (["--phase5-bind-steps", "-2"], "--phase5-bind-steps must be >= 0"),
    (["--phase5-decide-steps", "-3"], "--phase5-decide-steps must be >= 0"),
    (["--phase5-long-steps", "-1"], "--phase5-long-steps must be >= 0"),
    (["--phase5-far-steps", "-2"], "--phase5-far-steps must be >= 0"),
    (["--phase5-gaps-steps", "-3"], "--phase5-gaps-steps must be >= 0"),
    (["--phase5-details-steps", "-4"], "--phase5-details-steps must be >= 0"),
    (["--phase5-wide-steps", "-1"], "--phase5-wide-steps must be >= 0"),
    (["--phase5-decide-keys", "greek"], "argument --phase5-decide-keys: invalid choice: 'greek'"),
    (["--phase2-minutes", "0"], "--phase2-minutes must be positive"),
])
def test_bad_recipe_arguments_fail_in_one_line_before_any_work(args, message, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from recipes.default_model import build_default

    monkeypatch.setattr(sys, "argv", ["build_default", "--work", str(tmp_path / "work"), *args])
    with pytest.raises(SystemExit) as exc:
        build_default.main()
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "work").exists()
