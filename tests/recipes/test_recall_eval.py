"""recall_eval's two-codes measure: it tells a model that matches the key from one that
answers with the latest code."""

from __future__ import annotations

import pytest
import torch

from recipes.demo_model import recall_eval
from recipes.demo_model.corpus import Passage
from agent.runtime.checkpoint import load_model

PASSAGES = [Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them.")]


@pytest.mark.parametrize(("policy", "right", "swapped"), [("asked", 1.0, 0.0), ("latest", 0.5, 0.5), ("first", 0.5, 0.5)])
def test_keys_counts_the_asked_code_right_and_the_other_held_code_swapped(monkeypatch, policy: str, right: float,
                                                                         swapped: float) -> None:
    torch.set_num_threads(1)
    made: list = []
    real_code = recall_eval.held_out_code

    def code(rng):  # type: ignore[no-untyped-def]
        f = real_code(rng)
        made.append(f)
        return f

    def ask(lm, state, f, rng):  # type: ignore[no-untyped-def]
        pair = made[-2:]  # the two codes of this trial (seeded: none was redrawn)
        pick = {"asked": f, "latest": pair[-1], "first": pair[0]}[policy]
        return f"The code is {pick.value}.", True

    monkeypatch.setattr(recall_eval, "held_out_code", code)
    monkeypatch.setattr(recall_eval, "_ask", ask)
    out = recall_eval.evaluate(load_model("tiny"), PASSAGES, distances=(0, 16), trials=3, kinds=("keys",))
    assert out["keys_right"] == {0: right, 16: right}
    assert out["keys_swapped"] == {0: swapped, 16: swapped}
