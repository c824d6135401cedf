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

ANSWER_FORMS = ("The [^.]+ for the [^.]+ is .+", "Your [^.]+ is .+", "You haven't told me .+")
ANSWER = re.compile(rf"^({'|'.join(ANSWER_FORMS)})$")


class WeightedTrainer(Trainer):
    answers: re.Pattern[str] = ANSWER  # a whole reply that is a recall answer; a trial may pass its own

    def __init__(self, *args: Any, answer_weight: float = 1.0, answers: re.Pattern[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer_weight = answer_weight
        if answers is not None:
            self.answers = answers

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
                if j - i < 64 and self.answers.match(tok.decode(row[i:j]).strip()):
                    w[r, i:j] = self.answer_weight
                i = j
        return w

    def loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.answer_weight == 1.0 or self.initial is not None:
            return super().loss_sum(inputs, labels)
        with self.autocast():
            logits, _ = self.model(inputs.to(self.device), None)
        per = F.cross_entropy(logits.float().flatten(0, 1), labels.to(self.device).flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        return (per * self._weights(labels).flatten().to(per.device)).sum()


class FocusTrainer(WeightedTrainer):
    """A WeightedTrainer that also weights, inside recall answers, the tokens where the
    answer is decided (`focus`, any of FOCUS): "digit", a value's first digit; "decision",
    the token right after " is" (" something" for a key-local refusal, the value's start
    otherwise); "key", the key restated after "for the" (up to " is"). `focus_only` drops
    every other token from the loss, which is how key matching was first learned
    (measured: with the whole answer in the loss it had not appeared after 1,000 steps;
    with the first digit alone it did after 450)."""

    FOCUS = ("digit", "decision", "key")

    def __init__(self, *args: Any, focus: tuple[str, ...] = FOCUS, focus_weight: float = 8.0, focus_only: bool = False,
                 **kwargs: Any) -> None:
        if not set(focus) <= set(self.FOCUS):
            raise ValueError(f"unknown focus {sorted(set(focus) - set(self.FOCUS))}; expected some of {', '.join(self.FOCUS)}")
        super().__init__(*args, **kwargs)
        self.focus_on, self.focus_weight, self.focus_only = tuple(focus), focus_weight, focus_only

    def focus(self, labels: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """Boolean mask of the decision tokens inside `answers` (a mask of answer tokens)."""
        tok = self.base.tokenizer  # set once the run has loaded its base
        digits = {tok.encode(str(d))[0] for d in range(10)}
        space, is_, for_, the = (tok.encode(s)[-1] for s in (" ", " is", " for", " the"))
        want = set(self.focus_on)
        out = torch.zeros(labels.shape, dtype=torch.bool)
        for r in range(labels.shape[0]):
            row, ans = labels[r].tolist(), answers[r].tolist()
            copying = False
            for i in range(1, len(row)):
                if not ans[i]:
                    copying = False
                    continue
                if row[i] == is_:
                    copying = False
                if (("key" in want and copying) or ("decision" in want and row[i - 1] == is_)
                        or ("digit" in want and row[i] in digits and row[i - 1] == space)):
                    out[r, i] = True
                if i >= 2 and row[i - 1] == the and row[i - 2] == for_:
                    copying = True
                    out[r, i] |= "key" in want
        return out

    def _weights(self, labels: torch.Tensor) -> torch.Tensor:
        w = super()._weights(labels)
        focus = self.focus(labels, w > 1)
        if self.focus_only:
            w = torch.zeros_like(w)
        w[focus] = self.focus_weight
        return w
