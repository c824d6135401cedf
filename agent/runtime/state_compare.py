"""How far a stored state is from a fresh replay of its transcript, row by row.

A stored state was built from prefill segments and one-token decode steps; a replay folds
whole turns in chunks. In fp32 the two differ by accumulation order, and that difference
grows with depth: an elementwise `allclose(rtol=1e-4, atol=1e-5)` (made for GLA states,
which are sums over many tokens) fails every window model past its window, whose ring
holds single tokens' keys and values from deep layers, where a relative 1e-3 is ordinary.

So the comparison is made per row: a row is a state tensor's last dimension (one token's
key or value in one ring slot of one layer and group; one key feature's row of a GLA
state; one channel's short-conv history), and its difference is measured relative to the
row's own size. A wrong or missing token changes whole rows by O(1) (a ring slot holding
another token's key, a shifted ring, a conv history of other inputs) or, in a GLA sum,
changes rows by its decayed share of the sum; accumulation order changes each row by far
less (see `recipes/experiments/verify_tolerance.py` for the measurement behind
`ROW_TOLERANCE`). Rows far smaller than their layer's typical row (an emptied ring slot, a
decayed-away feature) are measured against a thousandth of that typical size instead, so
noise on a near-zero row cannot fail the check. Integer parts (positions) must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agent.runtime.state import RecurrentState
from agent.runtime.state_spec import MEMORY_GROUPS

# The largest relative row difference a replay may show. Measured (verify_tolerance.py,
# turns of 112 prefilled + 16 stepped tokens; worst row of any part):
#   accumulation order: gla 12x768 1.1e-4 (1k) / 4.8e-5 (4k); ssd 12x768 4.8e-4 / 1.3e-4;
#     window 30x576 (random) 1.5e-6 / 9.4e-6; the default model 1.7e-5 (1k)
#   one token wrong or missing 1 or 100 tokens before the end: 1.0-1.9 everywhere;
#   one token wrong half way back: gla 1.4 / 0.18, ssd 1.4 / 0.045, window 0.057 / 0.036,
#     the default model 0.54
# so 1e-2 sits 20x above the noise and 3.6x below the faintest single-token change seen
# (a token 2,000 back in a 4k window state: it survives only in the GLA branch's sum).
ROW_TOLERANCE = 1e-2
# int8 weights have two runtimes with two roundings: torch's (`quant.Int8Linear`: activations
# and sums rounded to bf16) and the torch-free engine's (`native/engine.py`: activations to
# int16 per row, exact int32 sums), and a session may hold states of both (it moves between
# `serve` and `chat`). Measured on the default model (recipes/experiments/runtime_parity.py:
# the engine's state against torch's for the same tokens): worst row 0.091 after a 700-token
# prefill and 44 steps, 0.048 after 2,000 and 40; one token wrong half way back moves it by
# 0.54 (above). So an int8 model's states are held to 0.2 instead.
INT8_ROW_TOLERANCE = 0.2
# Rows smaller than this fraction of their layer's RMS row norm are measured against it.
ROW_FLOOR = 1e-3


@dataclass(frozen=True)
class PartDifference:
    """One state tensor: its largest relative row difference and where it is."""

    name: str
    worst: float  # max over rows of |a - b| / max(|a|, |b|, floor)
    where: tuple[int, ...]  # index of that row (all dims but the last)
    max_abs: float  # the largest elementwise difference, for the report

    def line(self) -> str:
        return f"{self.name}: {self.worst:.2g} at {list(self.where)} (largest elementwise {self.max_abs:.2g})"


def row_differences(a: Tensor, b: Tensor, floor: float = ROW_FLOOR) -> Tensor:
    """Relative difference of every row (last dim) of two float tensors [L, ...]: a tensor
    of their shape without the last dim. Each row is measured against the larger of its two
    norms, or `floor` x its layer's RMS row norm (dim 0), whichever is larger."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.dim() == 1:
        a, b = a[None], b[None]
    diff = torch.linalg.vector_norm(a - b, dim=-1)
    size = torch.maximum(torch.linalg.vector_norm(a, dim=-1), torch.linalg.vector_norm(b, dim=-1))
    per_layer = size.reshape(size.shape[0], -1).pow(2).mean(dim=1).sqrt()  # [L]
    scale = torch.clamp(floor * per_layer, min=torch.finfo(torch.float32).tiny)
    scale = scale.reshape(-1, *([1] * (size.dim() - 1)))
    return diff / torch.maximum(size, scale)


# The window mixer's memory (memory.py) keeps the M best-scored evicted tokens; a token whose
# score ties the M-th best within accumulation noise may be kept by one reading and not by
# the other, and the slots are in position order. So the memory is compared token by token
# (slots matched by position), and up to this share of a state's held tokens may differ.
MEMORY_SWAP_SHARE = 0.05


def _memory_matched(stored: RecurrentState, replayed: RecurrentState, parts: tuple[str, ...]
                    ) -> tuple[dict[str, tuple[Tensor, Tensor]], PartDifference]:
    """A memory group's parts (k, v, score, pos: `state_spec.MEMORY_GROUPS`) with the replay's
    slots moved to the stored state's order (slots whose token the replay does not hold are
    zeroed in both), and the share that differ."""
    a_pos, b_pos = stored.tensors[parts[3]].cpu(), replayed.tensors[parts[3]].cpu()
    same = (a_pos[..., :, None] == b_pos[..., None, :]) & (a_pos != 0)[..., None]  # [L, B, G, M, M]
    matched = same.any(-1)
    at = same.float().argmax(-1)  # the replay's slot of each stored slot's token
    held = int((a_pos != 0).sum()) + int((b_pos != 0).sum())
    swapped = 0.0 if not held else 1.0 - 2 * int(matched.sum()) / held
    out = {}
    for name in parts[:3]:
        a, b = stored.tensors[name].cpu(), replayed.tensors[name].cpu()
        idx = at if a.dim() == at.dim() else at[..., None].expand(a.shape)
        keep = matched if a.dim() == at.dim() else matched[..., None]
        out[name] = (a * keep, b.gather(a.dim() - 1 if a.dim() == at.dim() else -2, idx) * keep)
    part = PartDifference(parts[3], 0.0 if swapped <= MEMORY_SWAP_SHARE else float("inf"), (), swapped)
    return out, part


def compare(stored: RecurrentState, replayed: RecurrentState) -> list[PartDifference]:
    """Every part's worst row difference (an integer part: 0.0 when equal, inf when not;
    the memory's positions: 0.0 while at most MEMORY_SWAP_SHARE of its tokens differ).
    Raises ValueError when the two hold different parts or shapes."""
    if stored.names != replayed.names:
        raise ValueError(f"states hold different tensors: {stored.names} vs {replayed.names}")
    for name in stored.names:
        if stored.tensors[name].shape != replayed.tensors[name].shape:
            raise ValueError(f"state part {name} has shape {tuple(stored.tensors[name].shape)}, the replay {tuple(replayed.tensors[name].shape)}")
    memory: dict[str, tuple[Tensor, Tensor]] = {}
    out = []
    for group in MEMORY_GROUPS:
        if group[3] in stored.names:
            matched, part = _memory_matched(stored, replayed, group)
            memory |= matched
            out.append(part)
    positions = {group[3] for group in MEMORY_GROUPS}  # compared token by token above
    for name in stored.names:
        if name in positions:
            continue
        a, b = memory.get(name) or (stored.tensors[name], replayed.tensors[name])
        if a.numel() == 0:
            out.append(PartDifference(name, 0.0, (), 0.0))
            continue
        if not a.is_floating_point():
            equal = bool(torch.equal(a.cpu(), b.cpu()))
            out.append(PartDifference(name, 0.0 if equal else float("inf"), (), 0.0 if equal else float("inf")))
            continue
        rows = row_differences(a, b)
        flat = int(rows.argmax())
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), rows.shape))
        max_abs = float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())
        out.append(PartDifference(name, float(rows.max()), where, max_abs))
    return out


def worst(parts: list[PartDifference]) -> PartDifference:
    return max(parts, key=lambda p: p.worst)


def same_state(stored: RecurrentState, replayed: RecurrentState, tolerance: float = ROW_TOLERANCE) -> bool:
    """Whether `stored` is `replayed` up to accumulation order (see the module docstring)."""
    return worst(compare(stored, replayed)).worst <= tolerance
