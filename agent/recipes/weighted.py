"""A Trainer whose loss weights the recall answers: the recipe's escalation after a no-go.

The recall signal is a few value tokens in a row of hundreds of trained tokens (small talk,
docstrings, acknowledgements), so its gradient is small beside theirs. This subclass
multiplies the loss of every assistant reply that is a recall answer ("The X for the Y is
V.", "Your X is V.", "You haven't told me ...") by `answer_weight`. The replies are found
in the labels themselves (a run of target tokens between two ignored ones is one reply),
so the trainer's data path is untouched. The step is still normalized by the number of
trained tokens, so the reported loss is the weighted one.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F

from agent.train.data import IGNORE_INDEX
from agent.train.loop import Trainer

ANSWER = re.compile(r"^(The [^.]+ for the [^.]+ is .+|Your [^.]+ is .+|You haven't told me .+)$")


class WeightedTrainer(Trainer):
    def __init__(self, *args: Any, answer_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer_weight = answer_weight

    def _weights(self, labels: torch.Tensor) -> torch.Tensor:
        w = torch.ones(labels.shape, dtype=torch.float32)
        tok = self.base.tokenizer
        for r in range(labels.shape[0]):
            row = labels[r].tolist()
            i = 0
            while i < len(row):
                if row[i] == IGNORE_INDEX:
                    i += 1
                    continue
                j = i
                while j < len(row) and row[j] != IGNORE_INDEX:
                    j += 1
                if j - i < 64 and ANSWER.match(tok.decode(row[i:j]).strip()):
                    w[r, i:j] = self.answer_weight
                i = j
        return w

    def _loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.answer_weight == 1.0 or self.initial is not None:
            return super()._loss_sum(inputs, labels)
        with self._autocast():
            logits, _ = self.model(inputs.to(self.device), None)
        per = F.cross_entropy(logits.float().flatten(0, 1), labels.to(self.device).flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        return (per * self._weights(labels).flatten().to(per.device)).sum()
