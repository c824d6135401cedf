"""Decoding one reply, whatever runs the model: the `Runner` a chat front end steps, and
`Generation`, an iterator of token ids with explicit state bookkeeping, so a caller that
stops early (cancel, stop string, length) can always get a state that has read exactly the
tokens it keeps.

Torch-free: a torch runner (`generation.EagerRunner`) and the C engine
(`native.runner.EngineRunner`) both satisfy `Runner`, and the logits, states and generators
passing through here are whichever kind the runner makes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence

from agent.runtime.reply import ReplySampler
from agent.runtime.sampling import SamplingOptions
from agent.runtime.tokenizer import Tokenizer


DEFAULT_SEGMENT = 512  # tokens a prefill reads per pass, rounded up to whole chunks (`segment_length`)


def segment_length(chunk: int, segment_len: int | None = None) -> int:
    """A runner's prefill segment: `segment_len`, by default DEFAULT_SEGMENT rounded up to
    whole chunks (an imported model's chunk need not divide 512). Every runner cuts the same
    segments, so a stream folds the same way on each."""
    segment_len = segment_len or -(-DEFAULT_SEGMENT // chunk) * chunk
    if segment_len % chunk:
        raise ValueError(f"segment length {segment_len} must be a multiple of the chunk size {chunk}")
    return segment_len


class Runner(Protocol):
    """What the chat layer asks of a batch-1 runner. Logits, states and generators are the
    runner's own kind; callers only pass them back."""

    segment_len: int

    @property
    def device(self) -> Any: ...

    def new_state(self) -> Any:
        """A fresh state (nothing read)."""

    def load_state(self, data: bytes, *, config: Any, fingerprint: str) -> Any:
        """A stored state blob, checked (format, checksum, model, shapes)."""

    def prefill(self, ids: Sequence[int], state: Any = None, progress: Any = None) -> tuple[Any, Any]:
        """(logits after the last id, the state after `ids`); `state` itself is never changed."""

    def step_token(self, token: int, state: Any) -> Any:
        """Read one token into `state` in place (counting it); its logits."""

    def new_generator(self, seed: int | None) -> Any:
        """A seeded generator `reply.ReplySampler` draws with from this runner's logits."""


@dataclass
class Generation:
    """Sample tokens until a stop token, a stop string, `max_new_tokens` or cancellation.

    Each token is picked by `reply.ReplySampler`, the loop body the server's scheduler uses
    too. Iterating yields token ids; `piece` is the text the last one completed (with a
    `tokenizer`). A stop token ends the turn and is not yielded (the caller folds the
    template's turn suffix). `state` has read every yielded token except possibly the last;
    `finish()` folds that one too and returns the state matching `tokens`. The state given
    is never changed: the first step copies it once, and decoding then updates that copy in
    place. `prompt_tail`: the ids read just before the reply, for the repetition penalty."""

    runner: Runner
    state: Any
    logits: Any  # [1, vocab] after the last prompt token (the runner's kind: torch or numpy)
    opts: SamplingOptions
    stop_ids: Sequence[int] = ()
    tokenizer: Tokenizer | None = None  # needed for stop strings and `piece`
    cancel: threading.Event | None = None
    generator: Any = None  # the runner's kind (`Runner.new_generator`); None: seeded from opts
    prompt_tail: Sequence[int] = ()
    stop_reason: str | None = None  # "stop" | "stop_string" | "length" | "cancelled"
    _pending: int | None = None
    _owned: bool = False  # `state` is this generation's own copy, stepped in place
    _origin: Any = None  # the state given, never written
    _sampler: ReplySampler = field(init=False)

    def __post_init__(self) -> None:
        self._origin = self.state
        if self.generator is None:
            self.generator = self.runner.new_generator(self.opts.seed)
        self._sampler = ReplySampler(self.opts, self.generator, stop_ids=self.stop_ids, tokenizer=self.tokenizer,
                                     prompt_tail=self.prompt_tail)

    @property
    def tokens(self) -> list[int]:
        return self._sampler.tokens

    @property
    def piece(self) -> str:
        return self._sampler.piece

    def flush(self) -> str:
        """Text held back at the end (an incomplete character)."""
        return self._sampler.flush()

    def __iter__(self) -> Iterator[int]:
        while self.stop_reason is None:
            if self.cancel is not None and self.cancel.is_set():
                self.stop_reason = "cancelled"
                return
            self._fold_pending()
            token = self._sampler.pick(self.logits)
            if token is not None:
                self._pending = token
                yield token
            self.stop_reason = self._sampler.stop_reason

    def _fold_pending(self) -> None:
        if self._pending is not None:
            if not self._owned:
                self.state, self._owned = self.state.clone(), True
            n = self.state.n_tokens
            try:
                self.logits = self.runner.step_token(self._pending, self.state)
            except BaseException:
                # A step that fails (or is interrupted) part-way leaves some layers written:
                # rebuild the state of the tokens folded before this one from the untouched
                # given state, so no state ever disagrees with the tokens it claims to hold.
                self._rebuild()
                raise
            self.state.n_tokens = n + 1
            self._pending = None

    def _rebuild(self) -> None:
        folded = self.tokens[:-1]  # the pending token is the last one yielded
        assert self._origin is not None
        self.state, self._owned = self._origin, False
        if folded:
            self.logits, self.state = self.runner.prefill(folded, self._origin)
            self._owned = True

    def finish(self) -> Any:
        """The state after reading exactly `self.tokens`."""
        self._fold_pending()
        return self.state
