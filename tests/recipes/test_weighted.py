"""The recipe's answer-weighted loss: only recall answers are up-weighted."""

from __future__ import annotations

import torch

from recipes.demo_model.weighted import WeightedTrainer
from agent.runtime.checkpoint import LoadedModel
from agent.runtime.config import get_preset
from agent.runtime.model import build_model
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from agent.train.data import encode_chat, pack


def test_weights_mark_recall_answers_only() -> None:
    tok, template = byte_level_tokenizer(), ChatTemplate()
    msgs = [{"role": "system", "content": ""},
            {"role": "user", "content": "The code for the red door is 12345."}, {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "What is the code for the red door?"},
            {"role": "assistant", "content": "The code for the red door is 12345."},
            {"role": "user", "content": "What is my dog's name?"}, {"role": "assistant", "content": "You haven't told me your dog's name."}]
    doc = encode_chat(msgs, tok, template)
    data = pack([doc], len(doc.ids) - 1, 0)
    _, labels = data.rows(torch.tensor([0]))
    t = WeightedTrainer.__new__(WeightedTrainer)
    t.base = LoadedModel(build_model(get_preset("tiny"), device="meta"), tok, template, name="tiny")
    t.answer_weight = 3.0
    w = t._weights(labels)
    up = tok.decode([i for i, x in zip(labels[0].tolist(), w[0].tolist()) if x > 1])
    assert "The code for the red door is 12345." in up and "You haven't told me your dog's name." in up
    assert "Noted" not in up
    assert bool((w[labels == -100] == 1).all())


def test_weighting_overrides_the_trainers_public_loss_hook() -> None:
    """The trainer calls `loss_sum`; an override under another name would silently train unweighted."""
    from agent.train.loop import Trainer

    assert WeightedTrainer.loss_sum is not Trainer.loss_sum
    assert not [n for n in vars(WeightedTrainer) if n.startswith("_loss")]
