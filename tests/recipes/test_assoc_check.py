from __future__ import annotations

import re

import pytest
import torch

from recipes.default_model.assoc_check import KEYS, VALUES, batch, main


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
