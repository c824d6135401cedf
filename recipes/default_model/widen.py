"""Widen a trained model's heads (a bigger state per head) without changing what it computes.

A Simple-GLA head reads `o = (K^-1/2 q) S` from its `K x V` state `S = sum_t decay * k_t^T v_t`,
then an RMSNorm over its V value dims, the output gate and `o_proj`. To grow K and V:

- new key dims: q's new rows are zero, so they add nothing to `q S` whatever k writes there;
  k's new rows are drawn as at init, so the new dims get gradients from the first step. Old
  q rows are scaled by sqrt(K_new / K_old) to undo the change of `K^-1/2`;
- new value dims repeat the old ones (v's rows copied), so the head norm's RMS over V is
  unchanged, exactly (a zero-filled value would change it through the norm's eps, which
  moved logits by up to 0.46 on the default model: some heads' outputs are that small);
  the norm's weights for them start at zero, so they are switched off, and the output gate's
  and o's new columns are drawn as at init, so the norm weights get gradients at once.

Everything else is copied. `widen_heads` checks the result on a random batch.
"""

from __future__ import annotations

import math

import torch

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.model import build_model


@torch.no_grad()
def widen_heads(lm: LoadedModel, head_k_dim: int, head_v_dim: int, *, seed: int = 0, tolerance: float = 1e-3) -> LoadedModel:
    """`lm` with heads of `head_k_dim x head_v_dim` (each at least the old one, V a multiple
    of the old V), same logits up to `tolerance`; the new weights are drawn from `seed`."""
    c = lm.config
    H, K0, V0 = c.n_heads, c.head_k_dim, c.head_v_dim
    if head_k_dim < K0 or head_v_dim < V0 or head_v_dim % V0:
        raise ValueError(f"cannot widen heads of {K0}x{V0} to {head_k_dim}x{head_v_dim}: need K >= {K0} and V a multiple of {V0}")
    wide = build_model(c.replace(head_k_dim=head_k_dim, head_v_dim=head_v_dim), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    old = lm.model.state_dict()

    def drawn(shape: torch.Size, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std

    for name, p in wide.state_dict().items():
        o = old[name]
        if p.shape == o.shape:
            p.copy_(o)
            continue
        kind = name.split(".")[-2]
        if kind in ("q_proj", "k_proj"):  # [H * K, D]
            p.copy_(torch.zeros_like(p) if kind == "q_proj" else drawn(p.shape, c.init_std))
            p.view(H, head_k_dim, -1)[:, :K0] = o.view(H, K0, -1) * (math.sqrt(head_k_dim / K0) if kind == "q_proj" else 1.0)
        elif kind == "v_proj":  # [H * V, D]
            p.view(H, head_v_dim, -1).copy_(o.view(H, V0, -1).repeat(1, head_v_dim // V0, 1))
        elif kind == "gate_proj":  # [H * V, D]
            p.copy_(drawn(p.shape, c.init_std))
            p.view(H, head_v_dim, -1)[:, :V0] = o.view(H, V0, -1)
        elif kind == "o_proj":  # [D, H * V]
            p.copy_(drawn(p.shape, c.init_std) / math.sqrt(2 * c.n_layers))  # as init_weights scales residual outputs
            p.view(-1, H, head_v_dim)[:, :, :V0] = o.view(-1, H, V0)
        elif kind == "head_norm":  # [V]
            p.zero_()
            p[:V0] = o
        else:
            raise ValueError(f"widen_heads does not know how to widen {name} {tuple(o.shape)} -> {tuple(p.shape)}")
    ids = torch.randint(0, c.vocab_size, (2, 2 * c.chunk_size + 17), generator=gen)
    lm.model.eval()
    wide.eval()
    drift = float((lm.model(ids)[0] - wide(ids)[0]).abs().max())
    if drift > tolerance:
        raise RuntimeError(f"widened model's logits moved by {drift:.2e} (tolerance {tolerance:g}); this is a bug in widen_heads")
    return LoadedModel(wide, lm.tokenizer, lm.template, name=lm.name, card=dict(lm.card))
