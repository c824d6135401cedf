"""Running a model: segmented prefill, token-by-token generation, batched decode.

`Runner` is the seam between the math and the shapes a backend wants: `EagerRunner` calls
the model directly; `compiled.CompiledRunner` pads to fixed buckets for torch.compile.
`Generation` is an iterator of token ids with explicit state bookkeeping, so a caller that
stops early (cancel, stop string, length) can always get a state that has read exactly the
tokens it keeps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from agent.runtime.model import LaplaceModel
from agent.runtime.reply import ReplySampler, draw
from agent.runtime.sampling import SamplingOptions, make_generator, sample
from agent.runtime.state import RecurrentState
from agent.runtime.tokenizer import Tokenizer

ProgressFn = Callable[[int, int], None]  # (tokens done, tokens total)
DEFAULT_SEGMENT = 512


class EagerRunner:
    """Prefill in fixed-size segments and decode one token at a time, eagerly."""

    def __init__(self, model: LaplaceModel, segment_len: int | None = None) -> None:
        chunk = model.config.chunk_size
        # Default: DEFAULT_SEGMENT rounded up to whole chunks (an imported model's chunk need
        # not divide 512).
        segment_len = segment_len or -(-DEFAULT_SEGMENT // chunk) * chunk
        if segment_len % chunk:
            raise ValueError(f"segment length {segment_len} must be a multiple of the chunk size {chunk}")
        self.model = model
        self.segment_len = segment_len

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def forward_segment(self, ids: Tensor, state: RecurrentState, lengths: Tensor | None) -> tuple[Tensor, RecurrentState]:
        """ids [B, L] (L <= segment) -> (last logits [B, vocab], state)."""
        logits, state = self.model(ids, state, lengths=lengths, last_only=True)
        return logits[:, -1], state

    def step(self, tokens: Tensor, state: RecurrentState) -> tuple[Tensor, RecurrentState]:
        """tokens [B] -> (logits [B, vocab], a new state); `state` is left as it was."""
        new = RecurrentState({name: t.clone() for name, t in state.tensors.items()}, state.n_tokens)
        return self.step_(tokens, new), new

    def step_(self, tokens: Tensor, state: RecurrentState) -> Tensor:
        """tokens [B] -> logits [B, vocab], folding them into `state` in place (the decode
        loop's form: no new state per token). The model counts the token (n_tokens and
        positions), as `step`'s does."""
        return self.model.step_(tokens, state)

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], state: RecurrentState | None = None, progress: ProgressFn | None = None) -> tuple[Tensor, RecurrentState]:
        """Fold `ids` into a batch-1 state segment by segment; peak memory is set by the
        segment length, not by len(ids). Returns the logits after the last token."""
        if len(ids) == 0:
            raise ValueError("prefill needs at least one token")
        state = state if state is not None else self.model.new_state(1)
        n0 = state.n_tokens
        all_ids = torch.as_tensor(list(ids), dtype=torch.long, device=self.device)
        logits = None
        for start in range(0, len(ids), self.segment_len):
            seg = all_ids[start : start + self.segment_len][None]
            logits, state = self.forward_segment(seg, state, None)
            if progress is not None:
                progress(min(start + self.segment_len, len(ids)), len(ids))
        state.n_tokens = n0 + len(ids)
        state.check_positions()  # the host's count and the model's positions agree
        assert logits is not None
        return logits, state


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

    runner: EagerRunner
    state: RecurrentState
    logits: Tensor  # [1, vocab] after the last prompt token
    opts: SamplingOptions
    stop_ids: Sequence[int] = ()
    tokenizer: Tokenizer | None = None  # needed for stop strings and `piece`
    cancel: threading.Event | None = None
    generator: torch.Generator | None = None
    prompt_tail: Sequence[int] = ()
    stop_reason: str | None = None  # "stop" | "stop_string" | "length" | "cancelled"
    _pending: int | None = None
    _owned: bool = False  # `state` is this generation's own copy, stepped in place
    _origin: RecurrentState | None = None  # the state given, never written
    _sampler: ReplySampler = field(init=False)

    def __post_init__(self) -> None:
        self._origin = self.state
        if self.generator is None:
            self.generator = make_generator(self.opts.seed)
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

    @torch.inference_mode()
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
            tok = torch.tensor([self._pending], dtype=torch.long, device=self.logits.device)
            if not self._owned:
                self.state, self._owned = self.state.clone(), True
            n = self.state.n_tokens
            try:
                self.logits = self.runner.step_(tok, self.state)
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

    @torch.inference_mode()
    def finish(self) -> RecurrentState:
        """The state after reading exactly `self.tokens`."""
        self._fold_pending()
        return self.state


@torch.inference_mode()
def generate_batch(
    runner: EagerRunner,
    prompts: Sequence[Sequence[int]],
    opts: SamplingOptions,
    *,
    stop_ids: Sequence[int] = (),
    widths: Sequence[int] = (1, 2, 4, 8, 16),
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Generate for several prompts at once, decoding in a batch padded to a fixed width.

    Rows are independent in every op, so padding rows (and finished rows, which keep
    stepping on a dummy token) never change a real row's tokens."""
    n = len(prompts)
    width = next((w for w in sorted(widths) if w >= n), None)
    if width is None:
        raise ValueError(f"{n} prompts exceed the largest batch width {max(widths)}")
    generator = generator or make_generator(opts.seed)
    device = runner.device
    # Prefill each prompt separately (peak memory stays per-segment), then join the rows.
    rows = [runner.prefill(p) for p in prompts]
    logits = torch.cat([r[0] for r in rows] + [rows[0][0].new_zeros(width - n, rows[0][0].shape[-1])])
    state = RecurrentState.stack([r[1] for r in rows]).padded_to(width)  # a new tensor: stepped in place
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    for _ in range(opts.max_new_tokens):
        tokens = sample(logits, generator, **draw(opts))
        for i in range(n):
            if not done[i]:
                t = int(tokens[i])
                if t in stop_ids:
                    done[i] = True
                else:
                    out[i].append(t)
        if all(done):
            break
        logits = runner.step_(tokens.to(device), state)
    return out
