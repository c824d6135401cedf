"""Running a model: segmented prefill, token-by-token generation, batched decode.

A runner is the seam between the math and the shapes a backend wants: `EagerRunner` calls
the model directly; `compiled.CompiledRunner` pads to fixed buckets for torch.compile; the
torch-free `native.runner.EngineRunner` runs the C engine. What the chat layer asks of one
is `agent.runtime.decoding.Runner`. `Generation` (agent/runtime/decoding.py, re-exported
here) is an iterator of token ids with explicit state bookkeeping.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from agent.runtime.decoding import DEFAULT_SEGMENT, Generation, segment_length
from agent.runtime.model import LaplaceModel
from agent.runtime.reply import draw
from agent.runtime.sampling import SamplingOptions, make_generator, sample
from agent.runtime.state import RecurrentState

__all__ = ["DEFAULT_SEGMENT", "EagerRunner", "Generation", "ProgressFn", "generate_batch"]

ProgressFn = Callable[[int, int], None]  # (tokens done, tokens total)


class EagerRunner:
    """Prefill in fixed-size segments and decode one token at a time, eagerly."""

    def __init__(self, model: LaplaceModel, segment_len: int | None = None) -> None:
        self.model = model
        self.segment_len = segment_length(model.config.chunk_size, segment_len)

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
    def step_token(self, token: int, state: RecurrentState) -> Tensor:
        """One token of a batch-1 state, in place (what `decoding.Generation` steps)."""
        return self.step_(torch.tensor([token], dtype=torch.long, device=self.device), state)

    def new_state(self) -> RecurrentState:
        return self.model.new_state(1)

    def load_state(self, data: bytes, *, config: object, fingerprint: str) -> RecurrentState:
        """A stored state blob on this runner's device (checked as `RecurrentState.from_bytes` does)."""
        return RecurrentState.from_bytes(data, config=config, fingerprint=fingerprint, device=self.device)  # type: ignore[arg-type]

    def new_generator(self, seed: int | None) -> torch.Generator:
        return make_generator(seed, "cpu")

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
