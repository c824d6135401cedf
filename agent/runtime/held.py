"""What a window state holds exactly: the token positions its softmax can still read.

A window mixer's state (`window.py`) keeps, per layer and kv head, the keys and values of
three sets of tokens of the stream it has read (n tokens, positions 0 .. n - 1):

- the sinks: positions [0, min(S, n));
- the window: the last W tokens, positions [max(S, n - W), n);
- the memory (when the config has `memory_slots`): the `mem_pos` tensor [L_mem, B, G, M] (over the layers that keep one;
  `rest_pos` over those of the second group, `state_spec`) holds 1 + the position each slot holds (0: empty; `memory.py`); slots differ across layers and heads, and a
  position held by any of them counts.

Everything else the state has read survives only in the GLA branch's lossy summary: for the
user, such a token is held by the transcript alone (recall refresh can read it back in).
A gla or ssd mixer keeps no exact tokens at all, so the question does not apply to it:
`held_positions` answers None there.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, TypeVar

import numpy as np

from agent.runtime.config import LaplaceConfig
from agent.runtime.state_spec import MEMORY_GROUPS

if TYPE_CHECKING:
    from agent.runtime.native.runner import ArrayState
    from agent.runtime.state import RecurrentState

K = TypeVar("K")
MEMORY = tuple(group[3] for group in MEMORY_GROUPS)  # each group's slots' positions + 1 [L_mem, B, G, M], 0 where empty


@dataclass(frozen=True)
class Held:
    """The positions row 0 of a window state holds exactly, after reading `n` tokens."""

    n: int
    sinks: range  # [0, min(S, n))
    window: range  # [max(S, n - W), n)
    memory: tuple[int, ...]  # sorted, distinct positions held by any layer's or head's memory

    def holds(self, position: int) -> bool:
        return self.holds_any(position, position + 1)

    def holds_any(self, start: int, stop: int) -> bool:
        """Whether any token of the span [start, stop) is held exactly (sinks, window, memory)."""
        if start >= stop:
            return False
        if _overlaps(self.sinks, start, stop) or _overlaps(self.window, start, stop):
            return True
        i = bisect_left(self.memory, start)
        return i < len(self.memory) and self.memory[i] < stop


def _overlaps(r: range, start: int, stop: int) -> bool:
    return max(r.start, start) < min(r.stop, stop)


def held_positions(state: RecurrentState | ArrayState, config: LaplaceConfig) -> Held | None:
    """What `state` (row 0) holds exactly, or None for a mixer that holds no exact tokens
    (gla, ssd: every token is folded into a recurrent matrix).

    n is the state's positions tensor when it has one (the model's own count), else the
    host's `n_tokens`. Memory positions outside [0, n) (empty slots) are left out."""
    if config.mixer != "window":
        return None
    pos = state.positions
    n = int(pos[0]) if pos is not None else state.n_tokens
    S, W = config.sinks, config.window
    memory: tuple[int, ...] = ()
    # torch tensors, or numpy for the engine's state (native.runner.ArrayState)
    groups = [np.asarray(t.cpu() if hasattr(t, "cpu") else t)[:, 0] - 1 for name in MEMORY if (t := state.tensors.get(name)) is not None]
    if groups:  # each [L, G, M] (batch is dim 1)
        rows = np.concatenate([g.reshape(-1) for g in groups])
        memory = tuple(int(p) for p in np.unique(rows[(rows >= 0) & (rows < n)]))  # np.unique sorts
    return Held(n=n, sinks=range(0, min(S, n)), window=range(max(S, n - W), n), memory=memory)


def held_by_transcript_only(held: Held, spans: Mapping[K, tuple[int, int]]) -> set[K]:
    """The keys of `spans` ([start, stop) of token positions, e.g. a transcript's turns)
    whose tokens have all been read and none of which `held` holds exactly: what only the
    transcript still holds word for word. Empty spans (a turn that stored no tokens) and
    spans not wholly read yet are never among them."""
    return {key for key, (start, stop) in spans.items()
            if start < stop <= held.n and not held.holds_any(start, stop)}
