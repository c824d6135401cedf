"""The Laplace model: a decoder whose token mixers keep a fixed-size state. This file holds
the math only.

Each block's token mixer is one of three: the Laplace GLA mixer (`mixers.py`: pure Simple
GLA, the demo model and the presets), the Mamba-2 family's (`ssd.py`, for imported
checkpoints), or the window hybrid of a converted Llama teacher (`window.py`: softmax
attention over a window of recent tokens plus sinks, and a GLA branch over the older ones;
the default model). All have the one interface `mixers.py` describes, so nothing here asks
which one a block holds; tokens read are counted by the state (`RecurrentState.advanced` /
`advance_`), in one place.

State goes in and comes out of `forward` explicitly (never stored on modules), so the same
weights serve any number of sessions and a decode step always has the same shapes.
Sampling, stopping and streaming live in `generation.py`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, RMSNorm
from agent.runtime.mixers import MIXERS
from agent.runtime.native import decode as native_decode
from agent.runtime.state import RecurrentState
from agent.runtime.state_spec import layer_rows


class Block(nn.Module):
    """Pre-norm residual block: the token mixer (any of `mixers.MIXERS`, through their one
    interface), then (unless ffn_dim is 0) a GLU."""

    def __init__(self, config: LaplaceConfig, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = MIXERS[config.mixer](config)
        if config.mixer == "window":  # the distance this layer's group reads its memory at
            self.attn.memory_at = config.memory_read_at_layer(layer)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps) if config.ffn_dim else None
        self.ffn = GLU(config) if config.ffn_dim else None

    def forward(self, x: Tensor, layer: dict[str, Tensor], lengths: Tensor | None, pos: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """`layer`: this layer's slice of each state tensor; `pos` [B]: tokens read, or None."""
        a, layer = self.attn(self.attn_norm(x), layer, lengths, pos)
        x = x + a
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x, layer

    def step_(self, x: Tensor, layer: dict[str, Tensor], pos: Tensor | None) -> Tensor:
        """One decode token: x [B, d_model] -> [B, d_model], this layer's state slices
        (views into the stacked state) written in place."""
        x = x + self.attn.step_(self.attn_norm(x), layer, pos)
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x


class LaplaceModel(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps if config.final_norm_eps is None else config.final_norm_eps)
        # Tied embeddings (Mamba-2 checkpoints): the LM head reads the input embedding.
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> "LaplaceModel":
        """Normal(0, init_std) matrices, residual outputs scaled by 1/sqrt(2L), and each
        mixer's own init (decay biases on the half-life schedule, decay weights zero)."""
        gen = torch.Generator(device="cpu")
        gen.manual_seed(0 if seed is None else seed)
        c = self.config
        std = c.init_std

        def normal_(p: Tensor, s: float) -> None:
            p.copy_(torch.randn(p.shape, generator=gen) * s)

        normal_(self.embed.weight, std)
        if self.lm_head is not None:
            normal_(self.lm_head.weight, std)
        self.norm.weight.fill_(1.0)
        out_std = std / math.sqrt(2 * c.n_layers)
        for block in self.blocks:
            for norm in (block.attn_norm, block.ffn_norm):
                if norm is not None:
                    norm.weight.fill_(1.0)
            block.attn.init_weights(gen, std, out_std, block.ffn)  # the GLU's draws are ordered by the mixer
        return self

    def new_state(self, batch: int = 1) -> RecurrentState:
        return RecurrentState.zeros(self.config, batch, self.embed.weight.device)

    def forward(
        self,
        input_ids: Tensor,
        state: RecurrentState | None = None,
        *,
        lengths: Tensor | None = None,
        last_only: bool = False,
        head: bool = True,
    ) -> tuple[Tensor, RecurrentState]:
        """input_ids [B, T] -> (logits [B, T, vocab] or [B, 1, vocab] with `last_only`, new state).
        With `head=False` the first item is the last block's output [B, T, d_model] instead, so
        a trainer can apply `self.head` a chunk at a time (the full [B, T, vocab] logits of a
        49k vocabulary are the largest tensor a training step would otherwise hold).

        `lengths` [B] marks how many leading tokens of each row are real; padded positions
        leave the state exactly as it was (used for fixed-shape buckets). The input state
        is never modified in place. One unpadded row on the CPU runs through `native.decode`
        where its kernels apply (the mixer token by token: the step's numbers)."""
        B, T = input_ids.shape
        if state is None:
            state = self.new_state(B)
        if B == 1 and lengths is None and (plan := native_decode.plan_for(self, state)) is not None:
            return native_decode.forward(plan, self, input_ids, state, last_only=last_only, head=head)
        x = self.embed(input_ids)
        pos = state.positions
        layers = state.layer_tensors
        # The new state is filled a layer at a time, each layer's tensors freed as soon as
        # they are copied in: stacking them at the end held every layer's copy beside the
        # stack and the input state (3 states at the peak, 2 now: 21 MB on the default model).
        # (Allocated like the input state: the same dtypes and shapes.)
        # A layer reads its name as row r of stacked tensor src (`state_spec.layer_rows`: a
        # memory group's only in its layers).
        new = {name: torch.empty_like(t) for name, t in layers.items()}
        for block, rows in zip(self.blocks, layer_rows(self.config, layers)):
            x, layer = block(x, {name: layers[src][r] for name, (src, r) in rows.items()}, lengths, pos)
            for name, (src, r) in rows.items():
                new[src][r].copy_(layer[name])
            del layer
        if last_only:
            if lengths is None:
                x = x[:, -1:]
            else:
                x = x.gather(1, (lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, x.shape[-1]))
        out = self.head(x) if head else x
        return out, state.advanced(new, T if lengths is None else lengths)

    def head(self, x: Tensor) -> Tensor:
        """The final norm and the LM head (the tied embedding's matrix, or int8's Linear)."""
        h = self.norm(x)
        return self.lm_head(h) if self.lm_head is not None else h @ self.embed.weight.t()

    def step_(self, tokens: Tensor, state: RecurrentState) -> Tensor:
        """The lean decode step: tokens [B] -> logits [B, vocab], folding them into `state`
        IN PLACE (its tensors are written, never replaced, and its count advanced by one).
        The same numbers as `forward(tokens[:, None], state)` without its per-step restack
        of the whole state; `forward` stays the reference it is tested against. One row on
        the CPU runs through `native.decode`'s C kernels where they apply (the same numbers)."""
        if tokens.shape[0] == 1 and (plan := native_decode.plan_for(self, state)) is not None:
            return native_decode.step_(plan, self, tokens, state)
        x = self.embed(tokens)
        pos = state.positions
        for block, layer in zip(self.blocks, state.layer_views(self.config)):
            x = block.step_(x, layer, pos)
        logits = self.head(x)
        state.advance_(1)
        return logits


def build_model(config: LaplaceConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> LaplaceModel:
    """A freshly initialized model. On the meta device, nothing is allocated."""
    with torch.device(device):
        model = LaplaceModel(config)
    if str(device) != "meta":
        model.init_weights(seed)
    return model.to(dtype=dtype)
