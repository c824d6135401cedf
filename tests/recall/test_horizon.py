"""The recall horizon: from the model card, else from the heads' half-lives."""

from __future__ import annotations

import random

from agent.probes.fillers import make_filler
from agent.recall.horizon import horizon_from_card, recall_horizon
from agent.recall.smalltalk import chat_ids
from agent.runtime.checkpoint import load_model


def test_horizon_from_the_card() -> None:
    assert horizon_from_card({"heldout_recall_5digit": "0:1.00 256:0.92 512:0.92 1024:0.85 2048:0.15"}) == 512
    assert horizon_from_card({"recall_horizon": 700, "heldout_recall_5digit": "0:1.00"}) == 700
    assert horizon_from_card({"heldout_recall_5digit": "0:0.50"}) is None
    assert horizon_from_card({}) is None


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
