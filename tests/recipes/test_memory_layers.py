"""recipes.smollm2_hybrid.measure.memory_layers: the per-layer ranking and the perplexity of
memories placed in chosen layers, on a tiny window model and a made-up training corpus."""

from __future__ import annotations

import json

import pytest
import torch

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from recipes.smollm2_hybrid.measure import memory_layers
from tests.runtime.test_window import window_model

QUIET = lambda _m: None  # noqa: E731


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    model = window_model(seed=0, vocab_size=264, window=16, sinks=2, gla_branch=False, n_layers=3)
    return LoadedModel(model, byte_level_tokenizer(), ChatTemplate(), name="tiny-window")


@pytest.fixture()
def corpus(tmp_path):
    lines = [{"source": s, "doc_id": f"{s}/{i}", "text": f"{s} {i} " * (20 + 10 * i)} for s in ("a", "b") for i in range(3)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    return tmp_path


def test_train_docs_take_one_long_enough_document_per_source(lm, corpus):
    docs = memory_layers.train_docs(corpus, lm.tokenizer.encode, 60)
    assert [d.split("/")[0] for d, _ in docs] == ["a", "b"] and all(len(ids) == 61 for _, ids in docs)


def test_rank_sees_far_attention_only_past_the_window(lm, corpus):
    docs = memory_layers.train_docs(corpus, lm.tokenizer.encode, 60)
    out = memory_layers.rank(lm, docs, 60)
    mass, diff = torch.tensor(out["mass"]), torch.tensor(out["diff"])
    assert mass.shape == diff.shape == (3, lm.config.kv_heads)
    assert (mass > 0).all() and (mass < 1).all() and (diff > 0).all()
    assert sorted(out["layers_by_diff"]) == [0, 1, 2]


def test_ppl_of_a_memory_in_chosen_layers_is_measured_against_the_window_and_full_attention(lm, corpus):
    docs = [(d, ids[:60]) for d, ids in memory_layers.train_docs(corpus, lm.tokenizer.encode, 60)]
    rows = memory_layers.ppl(lm, docs, ["window=none:0", "full=full", "every=all:64", "one=1:64", "two=1:64+8"], QUIET)
    w, f, e = (rows[n]["past_2048"] for n in ("window", "full", "every"))
    assert rows["every"]["past_2048_gap_closed"] == pytest.approx((w - e) / (w - f))
    assert rows["window"]["past_2048_gap_closed"] == 0 and rows["full"]["past_2048_gap_closed"] == 1
    assert len({rows[n]["past_2048"] for n in ("window", "full", "every", "one", "two")}) == 5  # each placement reads differently
    assert memory_layers.parse_layers("all", 3) == (0, 1, 2) and memory_layers.parse_layers("0,2", 3) == (0, 2)
