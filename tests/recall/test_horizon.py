"""The recall horizon: from the model card, else from the heads' half-lives."""

from __future__ import annotations

import random

from agent.probes.fillers import make_filler
import pytest

from agent.recall.horizon import check_measured, horizon_from_card, horizon_from_measured, recall_horizon
from agent.recall.smalltalk import chat_ids
from agent.runtime.checkpoint import load_model


def test_horizon_from_the_card() -> None:
    assert horizon_from_card({"heldout_recall_5digit": "0:1.00 256:0.92 512:0.92 1024:0.85 2048:0.15"}) == 512
    assert horizon_from_card({"recall_horizon": 700, "heldout_recall_5digit": "0:1.00"}) == 700
    assert horizon_from_card({"heldout_recall_5digit": "0:0.50"}) is None
    assert horizon_from_card({}) is None


MEASURED = {"distances": [384, 512, 1024], "state": [28, 30, 25], "full_attention": [31, 26, 19], "trials": 32,
            "how": "memory detail, 2026-12-05"}


def test_a_measured_card_refreshes_only_past_what_the_state_keeps() -> None:
    """`recall_measured`: the state's details against full attention's in one run. The horizon
    is the last distance up to which the state keeps >= 0.9x of full attention's."""
    assert horizon_from_measured(check_measured(MEASURED)) == 1024
    assert horizon_from_card({"recall_measured": MEASURED}) == 1024
    short = {**MEASURED, "state": [28, 20, 25]}  # 20 < 0.9 * 26 at 512: lost there, whatever 1,024 says
    assert horizon_from_card({"recall_measured": short}) == 384
    assert horizon_from_card({"recall_measured": {**MEASURED, "state": [20, 30, 25]}}) is None  # lost at the first
    assert horizon_from_card({"recall_measured": MEASURED, "recall_horizon": 300}) == 300  # the explicit override wins
    for bad, why in [({**MEASURED, "state": [1, 2]}, "3 whole numbers"), ({**MEASURED, "state": [1, 2, 40]}, "0..32"),
                     ({**MEASURED, "distances": [512, 384, 1024]}, "rise"), ({**MEASURED, "trials": 0}, "trials"),
                     ({k: v for k, v in MEASURED.items() if k != "how"}, "object of")]:
        with pytest.raises(ValueError, match=why):
            check_measured(bad)
        assert horizon_from_card({"recall_measured": bad}) is None  # a card edited by hand: the model's own rule


def test_a_window_hybrid_with_a_measured_card_says_where_its_horizon_comes_from() -> None:
    from types import SimpleNamespace

    lm = SimpleNamespace(card={"recall_measured": MEASURED}, config=SimpleNamespace(mixer="window", window=256))
    tokens, source = recall_horizon(lm)  # type: ignore[arg-type]
    assert tokens == 1024 and "0.9x full attention" in source and "memory detail, 2026-12-05" in source
    lm.card = {"recall_measured": {**MEASURED, "state": [20, 30, 25]}}
    assert recall_horizon(lm)[0] == 64  # lost at the first distance: a quarter of the window, as without a card


def test_the_horizon_reads_the_probes_chat_filler() -> None:
    """An input-driven mixer's decays are measured on the small talk the probes' chat filler
    is made of, token for token, so a probe run sees the horizon chat uses."""
    lm = load_model("tiny")
    filler = make_filler("chat", lm.tokenizer, lm.template).tokens(512, random.Random(0))
    assert chat_ids(lambda role, text: lm.template.message(lm.tokenizer, role, text), 512, random.Random(0)) == filler


def test_a_card_without_recall_falls_back_to_the_gates() -> None:
    lm = load_model("tiny")
    tokens, source = recall_horizon(lm)
    assert tokens > 0 and "half-life" in source


def test_a_window_hybrid_refreshes_what_leaves_a_quarter_of_its_window() -> None:
    from types import SimpleNamespace

    from agent.recall.horizon import recall_horizon

    lm = SimpleNamespace(card={}, config=SimpleNamespace(mixer="window", window=256))
    tokens, source = recall_horizon(lm)  # type: ignore[arg-type]
    assert tokens == 64 and "256-token window" in source
    lm.card = {"recall_horizon": 900}  # a measured card (a trained branch) wins
    assert recall_horizon(lm)[0] == 900  # type: ignore[arg-type]


def test_the_default_model_ships_the_recall_it_was_measured_to_keep() -> None:
    """agent/models/smollm2/settings.json puts `recall_measured` into the default's card; its
    horizon is the one docs/recall-refresh.md gives (1,024 tokens)."""
    from agent.importers.shipped import SETTINGS_FILE, SHIPPED, read_settings

    measured = read_settings(SHIPPED / SETTINGS_FILE)["recall_measured"]
    assert horizon_from_measured(check_measured(measured)) == 1024
