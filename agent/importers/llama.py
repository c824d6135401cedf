"""Llama-architecture teachers -> the window hybrid (`mixer="window"`, runtime/window.py).

A Llama checkpoint (a Hugging Face directory, or a GGUF file read by `gguf_source.py`) is
described here in one neutral form: its shape (`LlamaShape`) and its tensors under
Hugging Face's names. `hybrid_weights` maps that onto our names, keeps every teacher
projection, norm and the GLU as they are, and adds the GLA branch at its initial values
(identity feature maps, the half-life schedule, the branch's gate at 0 or beta near 0),
so a converted model computes its teacher's attention over the window from the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from agent.importers.source import CheckpointError, expect_shape, take
from agent.runtime.config import LaplaceConfig
from agent.runtime.window import GLABranch

# The combine mode a new import gets. Measured (recipes/smollm2_hybrid/measure/combine.py, SmolLM2-135M,
# W = 256 + 4 sinks, attention transfer on 4 x 1024 tokens, 200 steps, same budget): the
# held-out attention error relative to the window alone fell to 0.61 with one softmax
# normalisation and still falling, against 0.86 and rising again for the gated sum. One
# normalisation has full attention's own form (the evicted keys' kernel mass takes its
# share from the window's); a gated sum can only add on top of a window that already sums
# to one. Gated stays available (--combine gated) where exactness at init matters more.
DEFAULT_COMBINE = "softmax"


@dataclass(frozen=True, kw_only=True)
class HybridOptions:
    """What `laplace import` chooses for the hybrid (the teacher decides everything else)."""

    window: int = 256
    sinks: int = 4
    gla_branch: bool = True
    combine: str = DEFAULT_COMBINE
    feature_map: str = "hedgehog"
    # The branch only sees keys older than the window, so its memories start at W tokens:
    # half-lives from W / 4 to 32 W at W = 256.
    half_life_min: float = 64.0
    half_life_max: float = 8192.0
    chunk_size: int = 64
    memory_slots: int = 0  # evicted tokens kept per layer and kv head (agent/runtime/memory.py); 0: none
    memory_policy: str = "recall"  # or "attention", "novelty" (agent/runtime/memory.py)
    memory_layers: tuple[int, ...] = ()  # the layers that keep it (empty: all)
    memory_rest_slots: int = 0  # slots per kv head in the layers memory_layers leaves out (0: none)
    memory_distance: int = 0  # the RoPE distance the window reads the memory at (0: W)
    memory_rest_distance: int = 0  # the same in the layers memory_layers leaves out (0: as memory_distance)


@dataclass(frozen=True, kw_only=True)
class LlamaShape:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float
    norm_eps: float
    tied: bool


def _int(cfg: dict[str, Any], key: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"config.json needs a positive integer {key}, got {v!r}")
    return v


def hf_llama_shape(cfg: dict[str, Any]) -> LlamaShape:
    """The shape of a transformers LlamaForCausalLM config.json, or a CheckpointError naming
    the variant we do not convert (biases, another activation, rope scaling)."""
    if cfg.get("hidden_act", "silu") not in ("silu", "swish") or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise CheckpointError("this Llama variant (attention or MLP bias, or an activation other than silu) is not supported")
    check_rope_scaling(cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}))
    heads = _int(cfg, "num_attention_heads")
    d = _int(cfg, "hidden_size")
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return LlamaShape(
        vocab_size=_int(cfg, "vocab_size"), d_model=d, n_layers=_int(cfg, "num_hidden_layers"), n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(cfg.get("head_dim") or d // heads),
        ffn_dim=_int(cfg, "intermediate_size"), rope_theta=float(theta), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tied=bool(cfg.get("tie_word_embeddings", False)),
    )


def check_rope_scaling(scaling: dict[str, Any]) -> None:
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind not in (None, "default"):
        raise CheckpointError(f"rope scaling {kind!r} is not supported (the window keeps the teacher's plain RoPE)")


def hybrid_config(shape: LlamaShape, opts: HybridOptions, *, name: str) -> LaplaceConfig:
    s = shape
    try:
        return LaplaceConfig(
            name=name, vocab_size=s.vocab_size, d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads,
            head_k_dim=s.head_dim, head_v_dim=s.head_dim, ffn_dim=s.ffn_dim, chunk_size=opts.chunk_size,
            norm_eps=s.norm_eps, half_life_min=opts.half_life_min, half_life_max=opts.half_life_max,
            tie_embeddings=s.tied, mixer="window", n_kv_heads=s.n_kv_heads, rope_theta=s.rope_theta,
            window=opts.window, sinks=opts.sinks, gla_branch=opts.gla_branch, feature_map=opts.feature_map,
            combine=opts.combine, memory_slots=opts.memory_slots, memory_policy=opts.memory_policy,
            memory_layers=tuple(opts.memory_layers), memory_rest_slots=opts.memory_rest_slots,
            memory_distance=opts.memory_distance, memory_rest_distance=opts.memory_rest_distance,
        )
    except ValueError as exc:
        raise CheckpointError(f"cannot make a window hybrid of this Llama ({exc})") from None


def hybrid_weights(shape: LlamaShape, tensors: Mapping[str, torch.Tensor], opts: HybridOptions, *, name: str) -> tuple[LaplaceConfig, dict[str, torch.Tensor]]:
    """(config, our state dict) from Hugging Face-named Llama tensors. Every source tensor
    must be used and every shape must fit, or a CheckpointError."""
    c = hybrid_config(shape, opts, name=name)
    # A lazy mapping (a GGUF's) is taken from as it is: each tensor is read when popped, so
    # only the model being built is held; a plain dict is copied so the caller's stays whole.
    src = tensors if getattr(tensors, "lazy", False) else dict(tensors)
    d, kv = c.d_model, c.kv_heads * c.head_k_dim
    out = {"embed.weight": expect_shape("model.embed_tokens.weight", take(src, "model.embed_tokens.weight"), (c.vocab_size, d)),
           "norm.weight": expect_shape("model.norm.weight", take(src, "model.norm.weight"), (d,))}
    head = src.pop("lm_head.weight", None)
    if c.tie_embeddings:
        if head is not None and not torch.equal(head, out["embed.weight"]):
            raise CheckpointError("config.json ties the embeddings but lm_head.weight differs from them; the checkpoint is inconsistent")
    elif head is None:
        raise CheckpointError("the checkpoint has no lm_head.weight and does not tie its embeddings")
    else:
        out["lm_head.weight"] = expect_shape("lm_head.weight", head, (c.vocab_size, d))
    branch = {}
    if c.gla_branch:
        module = GLABranch(c)
        module.init_weights()
        branch = {k: v.detach() for k, v in module.state_dict().items()}
    shapes = {"q_proj": (c.key_dim, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, c.value_dim)}
    for i in range(c.n_layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."

        def get(name: str, want: tuple[int, ...]) -> torch.Tensor:
            return expect_shape(p + name, take(src, p + name), want)

        out[q + "attn_norm.weight"] = get("input_layernorm.weight", (d,))
        out[q + "ffn_norm.weight"] = get("post_attention_layernorm.weight", (d,))
        for proj, want in shapes.items():
            out[q + f"attn.{proj}.weight"] = get(f"self_attn.{proj}.weight", want)
        for ours, theirs, want in (("w1", "gate_proj", (c.ffn_dim, d)), ("w3", "up_proj", (c.ffn_dim, d)), ("w2", "down_proj", (d, c.ffn_dim))):
            out[q + f"ffn.{ours}.weight"] = get(f"mlp.{theirs}.weight", want)
        for k, v in branch.items():
            out[q + f"attn.gla_branch.{k}"] = v.clone()
    left = [k for k in src if not k.endswith("rotary_emb.inv_freq")]  # a derived buffer some exports keep
    if left:
        raise CheckpointError(f"the checkpoint has tensors a Llama does not use: {', '.join(sorted(left)[:4])}; it is not a plain Llama")
    return c, out
