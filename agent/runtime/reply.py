"""One reply's choice of tokens: the sampling loop's body, shared by chat and the server.

`laplace chat` (through `generation.Generation`, which also steps a batch-1 state) and
`laplace serve` (whose scheduler steps many rows in one batch) pick each token through the
same `ReplySampler`, so one session, seed and options give the same tokens through both:

- the repetition penalty sees the last `PROMPT_TAIL` ids read before the reply (the end of
  the prompt: recall block, user message, reply prefix) and the reply's own last
  `PROMPT_TAIL` tokens;
- a stop token ends the reply without being kept; a stop string ends it after the token
  that completed it (the stored reply keeps what the model wrote, the state reads it);
  `max_new_tokens` ends it after that many tokens.

Stop strings are found by `StopStrings`, an incremental matcher (one KMP automaton per
string): feeding a piece of text costs O(len(piece) x number of strings), whatever the
length of the reply or of the strings, and it knows how many trailing characters could
still begin a stop string (what a streaming server must hold back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agent.runtime.sampling import SamplingOptions, sample, sample_array

if TYPE_CHECKING:
    import torch
    from torch import Tensor
from agent.runtime.tokenizer import StreamDecoder, Tokenizer

PROMPT_TAIL = 256  # ids of the prompt, and of the reply, that the repetition penalty sees


def draw(opts: SamplingOptions) -> dict[str, float | int]:
    """The options `sample` reads (the rest say when generation stops)."""
    return {"temperature": opts.temperature, "top_k": opts.top_k, "top_p": opts.top_p,
            "repetition_penalty": opts.repetition_penalty}


def _failure(s: str) -> list[int]:
    """KMP's failure function: fail[i] = the longest proper prefix of s[:i+1] that is also its suffix."""
    fail, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopStrings:
    """Finds the first stop string in text that arrives piece by piece."""

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("a stop string cannot be empty")
        self.stops = tuple(stops)
        self._fail = [_failure(s) for s in self.stops]
        self._matched = [0] * len(self.stops)  # per string: how much of it the text now ends with
        self.fed = 0  # characters fed so far

    def feed(self, piece: str) -> int | None:
        """Feed more text; the offset (in all the text fed) where a stop string begins when one
        is completed by this piece (the earliest to complete), else None."""
        for i, ch in enumerate(piece):
            hit = None
            for j, s in enumerate(self.stops):
                k, fail = self._matched[j], self._fail[j]
                while k and s[k] != ch:
                    k = fail[k - 1]
                if s[k] == ch:
                    k += 1
                if k == len(s):
                    start = self.fed + i + 1 - len(s)
                    hit = start if hit is None else min(hit, start)
                    k = fail[k - 1]
                self._matched[j] = k
            if hit is not None:
                self.fed += i + 1
                return hit
        self.fed += len(piece)
        return None

    @property
    def held(self) -> int:
        """Trailing characters that could be the start of a stop string."""
        return max(self._matched, default=0)


class ReplySampler:
    """Picks a reply's tokens one at a time from the logits the caller's model gives.

    `pick(logits)` returns the token to keep (the caller's state must read it before the
    next pick) or None when the reply ended without one (a stop token); `stop_reason` is set
    once the reply is over. `piece` is the text the last kept token completed (decoded
    incrementally, never half a character); `text` all of it.

    The generator says the backend: a `torch.Generator` picks from torch logits
    (`sampling.sample`), a `numpy.random.Generator` from numpy ones (`sampling.sample_array`,
    the torch-free engine's)."""

    def __init__(self, opts: SamplingOptions, generator: torch.Generator | np.random.Generator, *, stop_ids: Sequence[int] = (),
                 tokenizer: Tokenizer | None = None, prompt_tail: Sequence[int] = ()) -> None:
        if opts.stop and tokenizer is None:
            raise ValueError("stop strings need the tokenizer")
        self.opts = opts
        self.generator = generator
        self.stop_ids = frozenset(stop_ids)
        self.decoder = StreamDecoder(tokenizer) if tokenizer is not None else None
        self.stops = StopStrings(opts.stop) if opts.stop else None
        self.prompt_tail = list(prompt_tail)[-PROMPT_TAIL:]
        self.tokens: list[int] = []
        self.text = ""
        self.piece = ""
        self.stop_reason: str | None = None  # "stop" | "stop_string" | "length" (a caller adds "cancelled")
        self.stop_at: int | None = None  # where in `text` the stop string begins

    def history(self, device: torch.device) -> Tensor | None:
        if self.opts.repetition_penalty == 1.0:
            return None
        import torch

        hist = self.seen()
        return torch.tensor([hist], dtype=torch.long, device=device) if hist else None

    def seen(self) -> list[int]:
        """The ids the repetition penalty sees: the prompt's tail, then the reply's."""
        return self.prompt_tail + self.tokens[-PROMPT_TAIL:]

    def pick(self, logits: Any) -> int | None:
        """logits [1, vocab] (torch, or numpy [vocab]) -> the next token of the reply, or
        None when it ends here."""
        if self.stop_reason is not None:
            raise RuntimeError("the reply is over; nothing more to pick")
        if isinstance(self.generator, np.random.Generator):
            seen = self.seen() if self.opts.repetition_penalty != 1.0 else ()
            token = sample_array(logits, self.generator, **draw(self.opts), history=seen)
        else:
            token = int(sample(logits, self.generator, **draw(self.opts), history=self.history(logits.device))[0])
        if token in self.stop_ids:
            self.stop_reason, self.piece = "stop", ""
            return None
        self.tokens.append(token)
        self.piece = self.decoder.push(token) if self.decoder is not None else ""
        self.text += self.piece
        if self.stops is not None and self.piece:
            start = self.stops.feed(self.piece)
            if start is not None:
                self.stop_reason, self.stop_at = "stop_string", start
                return token
        if len(self.tokens) >= self.opts.max_new_tokens:
            self.stop_reason = "length"
        return token

    def flush(self) -> str:
        """The text still held back at the end (an incomplete character), added to `text`."""
        rest = self.decoder.flush() if self.decoder is not None else ""
        self.text += rest
        return rest

    @property
    def held(self) -> int:
        """Trailing characters of `text` that could still begin a stop string."""
        return self.stops.held if self.stops is not None and self.stop_reason is None else 0
