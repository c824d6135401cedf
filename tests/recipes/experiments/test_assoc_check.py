from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from recipes.experiments.assoc_check import KEYS, VALUES, batch, main


def test_each_query_is_labelled_with_the_value_bound_to_its_key() -> None:
    x, y = batch(torch.Generator().manual_seed(0), rows=5, pairs=6)
    assert x.shape == y.shape == (5, 24)
    for r in range(5):
        bound = dict(zip(x[r, 0:12:2].tolist(), x[r, 1:12:2].tolist()))
        assert len(bound) == 6 and all(KEYS[0] <= k < KEYS[1] and VALUES[0] <= v < VALUES[1] for k, v in bound.items())
        queried = x[r, 12::2].tolist()
        assert sorted(queried) == sorted(bound)  # every key asked once
        assert y[r, 12::2].tolist() == [bound[k] for k in queried]
        assert set(y[r, :12].tolist()) == {-100} and set(y[r, 13::2].tolist()) == {-100}


def test_the_drill_trains_and_reports_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--from", "default", "--steps", "2", "--rows", "4"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("default step 0 accuracy") and re.match(r"default step 2 loss [\d.]+ accuracy [01]\.\d{3} ", lines[-1])


def test_repeats_label_the_second_saying_from_its_second_token() -> None:
    from recipes.experiments.assoc_check import repeats

    x, y = repeats(torch.Generator().manual_seed(0), rows=3, length=5)
    assert torch.equal(x[:, :5], x[:, 5:])
    assert (y[:, :5] == -100).all() and (y[:, -1] == -100).all()
    assert torch.equal(y[:, 5:-1], x[:, 6:])  # each label is the token that follows, seen once before


def test_beside_plain_speech_it_saves_a_model_that_loads(tmp_path: Path) -> None:
    from agent.runtime.checkpoint import load_model_dir

    main(["--from", "default", "--steps", "1", "--rows", "2", "--natural-rows", "1", "--save", str(tmp_path)])
    assert (tmp_path / "natural.jsonl").stat().st_size > 0
    lm = load_model_dir(tmp_path / "model")
    assert lm.config.d_model == 256


@pytest.mark.parametrize("argv, message", [
    (["--from", "scratch", "--save", "X"], "need a trained model's tokenizer"),
    (["--from", "default", "--natural-rows", "2", "--save", "X"], "--natural-rows needs --steps"),
    (["--from", "default", "--natural-rows", "2", "--steps", "3"], "--natural-rows needs --save DIR"),
    (["--from", "/nonexistent/model"], "not a model directory"),
])
def test_bad_combinations_are_refused_before_training(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
