"""Phase 6's trial (recipes/experiments/phase6.py): it builds on the plan without changing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipes.demo_model.plan import PLAN
from recipes.experiments.phase6 import ANSWERS, PHASE6, TRIAL, Phase6Build, main, update_phase6_card

from ..test_card import _eval
from ..test_plan import stages_write_the_same_data_for_the_same_seed


def test_the_trial_is_the_plan_then_phase_6() -> None:
    assert TRIAL == (*PLAN, *PHASE6) and [s.name for s in PHASE6] == ["p6.natural512", "p6.wide512"]
    assert ANSWERS.match("You parked on level 4.") and ANSWERS.match("Your code is 12.")


def test_phase_6_stages_write_the_same_data_for_the_same_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stages_write_the_same_data_for_the_same_seed(Phase6Build, PHASE6, tmp_path, monkeypatch) == 2


@pytest.mark.parametrize("args, message", [
    (["--first-stage", "p3"], "--from-model and --first-stage go together"),
    (["--from-model", "x", "--first-stage", "p1.drill1"], "--first-stage p1.drill1 continues the run before it"),
    (["--from-model", "x", "--first-stage", "p9"], "--first-stage: no stage 'p9' in the plan"),
])
def test_bad_arguments_fail_in_one_line_before_any_work(args, message, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["--work", str(tmp_path / "work"), *args, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()


def test_a_continued_run_adds_its_stages_to_the_record_and_phase6_its_line(tmp_path: Path) -> None:
    before = {"stages": [{"phase": 1, "from_model": "/x", "card": {"curriculum": "256x250", "go_no_go": "g"}, "log": None},
                         {"phase": 5, "block": "long", "steps": [0, 1000], "rows": 1024, "lr": 1e-3,
                          "checks": [{"bind_right": 0.7, "bind_other": 0.3, "refusal_auc": 0.7}]}],
              "eval": {"old": True}}
    model = tmp_path / "model"
    model.mkdir()
    (model / "earlier_training_log.json").write_text(json.dumps(before))  # the record --from-model copied in
    p6 = {"phase": 6, "name": "p6.natural512", "block": "natural512", "steps": [0, 1800], "rows": 512, "lr": 1e-3,
          "data": {"natural_tokens": 4644864, "facts": 31141, "questions": 21735, "never": 17258, "updates": 3871}}
    (model / "config.json").write_text(json.dumps({"card": {"name": "default", "stages": [p6], "eval": {"new": True}}, "model": {}}))
    _eval(tmp_path / "work")
    out = update_phase6_card(model, tmp_path / "work", None)
    log = json.loads((model / "training_log.json").read_text())
    assert log["stages"] == before["stages"] + [p6] and log["eval"] == {"new": True}
    assert out["curriculum_phase6"] == ("1800 steps of rows of 512: 4.64 M tokens of plain-speech dialogues (31141 details, 21735 "
                                        "questions, 17258 never stated, 3871 updates) beside phase-5 rows, lr 0.001 (WSD)")
    assert out["curriculum"] == "256x250" and "curriculum_phase5" in out  # the earlier phases' lines still come from the record
    assert not (model / "earlier_training_log.json").exists()
