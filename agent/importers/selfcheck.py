"""A quick look at whether a converted model is right: perplexity and a greedy reply.

A wrong conversion (a transposed matrix, rows in the wrong order, a missing scale) gives
text perplexity near or above the vocabulary size: the model is guessing. A correct one
of a trained model is far below it. The bar is sqrt(vocabulary): 358 at 128k tokens,
224 at 50k; a trained English model reads the paragraph below at a few tens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.generation import EagerRunner, Generation
from agent.runtime.sampling import SamplingOptions

PARAGRAPH = (
    "The library opens at nine in the morning and closes at six in the evening. Children come after school "
    "to read picture books, and older students use the quiet room upstairs to study for their exams. On "
    "Saturdays a volunteer reads stories aloud, and parents often stay to listen. The building is old, but "
    "the windows are large, so the reading tables are bright even in winter."
)
PROMPT = "Hello! In one sentence, what is a library for?"


@dataclass
class SelfCheck:
    perplexity: float
    tokens: int
    reply: str
    bar: float

    @property
    def ok(self) -> bool:
        return math.isfinite(self.perplexity) and self.perplexity < self.bar


@torch.inference_mode()
def self_check(lm: LoadedModel, *, max_new_tokens: int = 40) -> SelfCheck:
    tok, template, model = lm.tokenizer, lm.template, lm.model
    ids = template.bos_ids(tok) + tok.encode(PARAGRAPH)
    x = torch.tensor([ids], device=model.embed.weight.device)
    logits, _ = model(x)
    nll = F.cross_entropy(logits[0, :-1].float(), x[0, 1:])
    runner = EagerRunner(model)
    prompt = template.message(tok, "system", "", first=True) + template.message(tok, "user", PROMPT) + template.reply_prefix(tok)
    last, state = runner.prefill(prompt)
    gen = Generation(runner, state, last, SamplingOptions(temperature=0.0, max_new_tokens=max_new_tokens), stop_ids=template.stop_ids(tok))
    tokens = list(gen)
    return SelfCheck(float(nll.exp()), len(ids) - 1, tok.decode(tokens).strip(), math.sqrt(lm.config.vocab_size))
