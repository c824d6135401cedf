"""The Laplace model: a decoder whose token mixers keep a fixed-size state. This file holds
the math only.

Each block's token mixer is one of three: the Laplace GLA mixer (below: pure Simple GLA,
the demo model and the presets), the Mamba-2 family's (`ssd.py`, for imported checkpoints),
or the window hybrid of a converted Llama teacher (`window.py`: softmax attention over a
window of recent tokens plus sinks, and a GLA branch over the older ones; the default
model). All are built from the parts in `layers.py` and carry their GLA state the same way.

State goes in and comes out of `forward` explicitly (never stored on modules), so the same
weights serve any number of sessions and a decode step always has the same shapes.
Sampling, stopping and streaming live in `generation.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.runtime.config import LaplaceConfig
from agent.runtime.layers import GLU, RMSNorm, ShortConv, conv_activation, mask_padding, run_gla, run_gla_step_
from agent.runtime.ssd import SSDMixer
from agent.runtime.state import RecurrentState
from agent.runtime.window import WindowAttention


class GLAAttention(nn.Module):
    """conv + SiLU -> q, k, v and a per-head scalar decay -> Simple GLA -> head norm -> gate -> o."""

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.conv = ShortConv(c.d_model, c.conv_size, bias=c.conv_bias)
        self.q_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.key_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.value_dim, bias=False)
        self.gate_proj = nn.Linear(c.d_model, c.value_dim, bias=False)  # output gate
        self.o_proj = nn.Linear(c.value_dim, c.d_model, bias=False)
        # Per-head scalar decay gate, grouped: head h reads its own d_model / H channels.
        self.decay_weight = nn.Parameter(torch.zeros(c.n_heads, c.d_model // c.n_heads))
        self.decay_bias = nn.Parameter(torch.zeros(c.n_heads))
        self.head_norm = RMSNorm(c.head_v_dim, c.norm_eps)
        self.decay_tap = nn.Identity()  # g passes through it, so probes can hook the decays

    def log_decay(self, c: Tensor) -> Tensor:
        """g = logsigmoid(w x + b) / normalizer, per head: [B, T, D] -> [B, T, H] fp32."""
        B, T, _ = c.shape
        H = self.config.n_heads
        pre = torch.einsum("bthd,hd->bth", c.float().view(B, T, H, -1), self.decay_weight.float())
        return F.logsigmoid(pre + self.decay_bias.float()) / self.config.gate_normalizer

    def resting_log_decay(self) -> Tensor:
        """g per head with the input term left out: [H]."""
        return F.logsigmoid(self.decay_bias.detach().float()) / self.config.gate_normalizer

    def forward(
        self, x: Tensor, gla_state: Tensor, conv_state: Tensor, lengths: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        B, T, _ = x.shape
        c, conv_state = self.conv(x, conv_state, lengths)
        c = conv_activation(cfg, c)
        q = self.q_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        k = self.k_proj(c).view(B, T, cfg.n_heads, cfg.head_k_dim)
        v = self.v_proj(c).view(B, T, cfg.n_heads, cfg.head_v_dim)
        g = self.decay_tap(self.log_decay(c))
        k, g = mask_padding(k, g, lengths)
        o, gla_state = run_gla(cfg, q, k, v, g, gla_state)
        o = self.head_norm(o).reshape(B, T, cfg.value_dim)
        o = o * F.silu(self.gate_proj(x))
        return self.o_proj(o), gla_state, conv_state


    def step_(self, x: Tensor, gla_state: Tensor, conv_state: Tensor) -> Tensor:
        """One decode token, both states updated in place: x [B, d_model] -> [B, d_model]."""
        cfg = self.config
        B = x.shape[0]
        H = cfg.n_heads
        c = conv_activation(cfg, self.conv.step_(x, conv_state))
        q = self.q_proj(c).view(B, H, cfg.head_k_dim)
        k = self.k_proj(c).view(B, H, cfg.head_k_dim)
        v = self.v_proj(c).view(B, H, cfg.head_v_dim)
        g = self.decay_tap(self.log_decay(c[:, None]))[:, 0]
        o = run_gla_step_(cfg, q, k, v, g, gla_state).to(x.dtype)
        o = self.head_norm(o).reshape(B, cfg.value_dim)
        o = o * F.silu(self.gate_proj(x))
        return self.o_proj(o)


class Block(nn.Module):
    """Pre-norm residual block: the token mixer, then (unless ffn_dim is 0) a GLU."""

    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        mixers = {"gla": GLAAttention, "ssd": SSDMixer, "window": WindowAttention}
        self.attn = mixers[config.mixer](config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps) if config.ffn_dim else None
        self.ffn = GLU(config) if config.ffn_dim else None

    def forward(self, x: Tensor, layer: dict[str, Tensor], lengths: Tensor | None, pos: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """`layer`: this layer's slice of each state tensor; `pos` [B]: tokens read (window mixer)."""
        h = self.attn_norm(x)
        if isinstance(self.attn, WindowAttention):
            assert pos is not None
            a, layer = self.attn(h, layer, lengths, pos)
        else:
            a, gla_state, conv_state = self.attn(h, layer["gla"], layer["conv"], lengths)
            layer = {"gla": gla_state, "conv": conv_state}
        x = x + a
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x, layer


    def step_(self, x: Tensor, layer: dict[str, Tensor], pos: Tensor | None) -> Tensor:
        """One decode token: x [B, d_model] -> [B, d_model], this layer's state slices
        (views into the stacked state) written in place."""
        h = self.attn_norm(x)
        if isinstance(self.attn, WindowAttention):
            # No lean form yet: the sequence form at T = 1, its new state copied back.
            assert pos is not None
            a, new = self.attn(h[:, None], layer, None, pos)
            for name, t in new.items():
                layer[name].copy_(t)
            x = x + a[:, 0]
        else:
            x = x + self.attn.step_(h, layer["gla"], layer["conv"])
        if self.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x


class LaplaceModel(nn.Module):
    def __init__(self, config: LaplaceConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps if config.final_norm_eps is None else config.final_norm_eps)
        # Tied embeddings (Mamba-2 checkpoints): the LM head reads the input embedding.
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> "LaplaceModel":
        """Normal(0, init_std) matrices, residual outputs scaled by 1/sqrt(2L), decay biases
        set to the half-life schedule and decay weights zero (so the schedule is exact)."""
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
        biases = torch.tensor(c.gate_biases())
        for block in self.blocks:
            a, ffn = block.attn, block.ffn
            glu = (ffn.w1, ffn.w3) if ffn is not None else ()
            for norm in (block.attn_norm, block.ffn_norm):
                if norm is not None:
                    norm.weight.fill_(1.0)
            if isinstance(a, (SSDMixer, WindowAttention)):
                for lin in glu:
                    normal_(lin.weight, std)
                if ffn is not None:
                    normal_(ffn.w2.weight, out_std)
                a.init_weights(gen, std, out_std)
                continue
            # The order of draws is the one the bundled model's recipe was trained from.
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.gate_proj, *glu):
                normal_(lin.weight, std)
            for lin in (a.o_proj, *((ffn.w2,) if ffn is not None else ())):
                normal_(lin.weight, out_std)
            normal_(a.conv.weight, 1.0 / math.sqrt(c.conv_size))
            if a.conv.bias is not None:
                a.conv.bias.zero_()
            a.decay_weight.zero_()
            a.decay_bias.copy_(biases)
            a.head_norm.weight.fill_(1.0)
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
    ) -> tuple[Tensor, RecurrentState]:
        """input_ids [B, T] -> (logits [B, T, vocab] or [B, 1, vocab] with `last_only`, new state).

        `lengths` [B] marks how many leading tokens of each row are real; padded positions
        leave the state exactly as it was (used for fixed-shape buckets). The input state
        is never modified in place."""
        B, T = input_ids.shape
        if state is None:
            state = self.new_state(B)
        x = self.embed(input_ids)
        pos = state.tensors.get("pos")  # [1, B]: tokens each row has read (window mixer)
        per_layer = [name for name in state.tensors if name != "pos"]
        new: dict[str, list[Tensor]] = {name: [] for name in per_layer}
        for i, block in enumerate(self.blocks):
            x, layer = block(x, {name: state.tensors[name][i] for name in per_layer}, lengths, None if pos is None else pos[0])
            for name in per_layer:
                new[name].append(layer[name])
        if last_only:
            if lengths is None:
                x = x[:, -1:]
            else:
                x = x.gather(1, (lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, x.shape[-1]))
        h = self.norm(x)
        logits = self.lm_head(h) if self.lm_head is not None else h @ self.embed.weight.t()
        tensors = {name: torch.stack(new[name]) for name in per_layer}
        if pos is not None:
            tensors["pos"] = pos + (T if lengths is None else lengths.to(pos.dtype)[None, :])
        # Token counting is host-side bookkeeping; with padded rows the caller knows the count.
        n_tokens = state.n_tokens + (T if lengths is None else 0)
        return logits, RecurrentState(tensors, n_tokens)


    def step_(self, tokens: Tensor, state: RecurrentState) -> Tensor:
        """The lean decode step: tokens [B] -> logits [B, vocab], folding them into `state`
        IN PLACE (its tensors are written, never replaced; n_tokens is the caller's). The
        same numbers as `forward(tokens[:, None], state)` without its per-step restack of
        the whole state; `forward` stays the reference it is tested against."""
        x = self.embed(tokens)
        pos = state.tensors.get("pos")
        names = [name for name in state.tensors if name != "pos"]
        for i, block in enumerate(self.blocks):
            x = block.step_(x, {name: state.tensors[name][i] for name in names}, None if pos is None else pos[0])
        h = self.norm(x)
        logits = self.lm_head(h) if self.lm_head is not None else h @ self.embed.weight.t()
        if pos is not None:
            pos.add_(1)
        return logits


def build_model(config: LaplaceConfig, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int | None = 0) -> LaplaceModel:
    """A freshly initialized model. On the meta device, nothing is allocated."""
    with torch.device(device):
        model = LaplaceModel(config)
    if str(device) != "meta":
        model.init_weights(seed)
    return model.to(dtype=dtype)
