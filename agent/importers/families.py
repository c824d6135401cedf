"""The checkpoint families we import, each as (detect, config, weight map).

Both map onto the `ssd` mixer (`agent/runtime/ssd.py`); the canonical in_proj row order
is (z, x, B, C, a).

- Llamba (cartesia-ai/Llamba-*): DiscreteMamba2 mixer + Llama GLU MLP. config.json has
  d_model, n_layer, ssm_cfg, mlp_cfg. in_proj rows are (x, B, C, z, a); its decay is
  -softplus(a), so A_log and dt_bias are written as zeros; v = x; gate y * silu(z + z_bias).
- Mamba2ForCausalLM (transformers' format, model_type "mamba2"): in_proj rows are
  (z, x, B, C, dt); decay -exp(A_log) softplus(dt + dt_bias); v = x * dt; gated RMSNorm in
  n_groups groups; no MLP; usually tied embeddings.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from agent.importers.source import CheckpointError, expect_shape, take
from agent.runtime.config import LaplaceConfig


def detect(config: dict[str, Any]) -> str:
    """'llamba', 'mamba2' or 'llama' (converted by `llama.py`), or CheckpointError naming what was found."""
    mt = str(config.get("model_type", ""))
    archs = [str(a) for a in config.get("architectures") or []]
    # cartesia's configs carry no model_type; ssm_cfg + mlp_cfg is the Llamba layout (each
    # key inside may be left to the code's defaults, n_v_heads included).
    if mt == "llamba" or (isinstance(config.get("ssm_cfg"), dict) and isinstance(config.get("mlp_cfg"), dict)):
        return "llamba"
    if mt == "mamba2" or "Mamba2ForCausalLM" in archs:
        return "mamba2"
    if mt == "llama" or "LlamaForCausalLM" in archs:
        return "llama"
    what = mt or (archs[0] if archs else "no model_type")
    raise CheckpointError(
        f"unknown architecture ({what}); laplace imports Llamba (cartesia-ai/Llamba-*), Mamba2ForCausalLM and LlamaForCausalLM checkpoints"
    )


# Parameters `map_weights` makes up rather than copies, by family (name suffixes): Llamba's
# decay is -softplus(a), i.e. the ssd mixer's with A_log and dt_bias at 0. The import
# records them in the card so that `laplace info` counts the checkpoint's own parameters.
SYNTHESIZED = {"llamba": ["attn.A_log", "attn.dt_bias"]}


def _need(cfg: dict[str, Any], key: str, kind: type = int) -> Any:
    v = cfg.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise CheckpointError(f"config.json needs {key} ({kind.__name__}), got {v!r}")
    return v


def llamba_config(cfg: dict[str, Any], vocab_rows: int) -> LaplaceConfig:
    ssm, mlp = dict(cfg.get("ssm_cfg") or {}), dict(cfg.get("mlp_cfg") or {})
    d = _need(cfg, "d_model")
    d_inner = int(ssm.get("expand", 1)) * d
    n_v, n_qk = int(ssm.get("n_v_heads", 32)), int(ssm.get("n_qk_heads", 32))
    if d_inner % n_v or n_v % n_qk:
        raise CheckpointError(f"ssm_cfg heads do not divide: d_inner {d_inner}, n_v_heads {n_v}, n_qk_heads {n_qk}")
    if mlp.get("act_fn", "silu") != "silu" or mlp.get("bias", False) or cfg.get("lm_head_bias", False):
        raise CheckpointError("this Llamba variant (MLP activation other than silu, MLP or LM-head bias) is not supported")
    return LaplaceConfig(
        name=str(cfg.get("_name_or_path") or "llamba"), vocab_size=vocab_rows, d_model=d, n_layers=_need(cfg, "n_layer"),
        n_heads=n_v, n_qk_heads=n_qk, head_k_dim=int(ssm.get("d_state", 64)), head_v_dim=d_inner // n_v,
        ffn_dim=int(mlp.get("intermediate_size", 0)), conv_size=int(ssm.get("d_conv", 4)),
        chunk_size=int(ssm.get("chunk_size", 128)), norm_eps=1e-5,  # Llamba's block norms hard-code 1e-5
        final_norm_eps=float(cfg.get("norm_epsilon", 1e-5)), mixer="ssd", qk_scale=False, d_skip=True,
        v_times_dt=False, gate="silu", conv_activation="silu" if ssm.get("activation", "identity") in ("silu", "swish") else "identity",
        conv_bias=bool(ssm.get("conv_bias", True)), proj_bias=bool(ssm.get("bias", False)),
        tie_embeddings=bool(cfg.get("tie_embeddings", False)),
    )


def mamba2_config(cfg: dict[str, Any], vocab_rows: int, tied: bool) -> LaplaceConfig:
    d = _need(cfg, "hidden_size")
    d_inner = int(float(cfg.get("expand", 2)) * d)
    heads, head_dim = _need(cfg, "num_heads"), _need(cfg, "head_dim")
    if heads * head_dim != d_inner:
        raise CheckpointError(f"num_heads x head_dim ({heads} x {head_dim}) != expand x hidden_size ({d_inner})")
    if not cfg.get("rms_norm", True) or cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError("this Mamba2 variant (LayerNorm, or an activation other than silu) is not supported")
    groups = int(cfg.get("n_groups", 1))
    lo, hi = (_number(v) for v in list(cfg.get("time_step_limit") or (0.0, math.inf))[:2])
    return LaplaceConfig(
        name=str(cfg.get("_name_or_path") or "mamba2"), vocab_size=vocab_rows, d_model=d,
        n_layers=_need(cfg, "num_hidden_layers"), n_heads=heads, n_qk_heads=groups, head_k_dim=_need(cfg, "state_size"),
        head_v_dim=head_dim, ffn_dim=0, conv_size=int(cfg.get("conv_kernel", 4)), chunk_size=int(cfg.get("chunk_size", 256)),
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), mixer="ssd", qk_scale=False, d_skip=True, v_times_dt=True,
        gate="rmsnorm", norm_groups=groups, conv_activation="silu", conv_bias=bool(cfg.get("use_conv_bias", True)),
        proj_bias=bool(cfg.get("use_bias", False)), dt_min=lo, dt_max=None if math.isinf(hi) else hi,
        tie_embeddings=tied,
    )


def _number(v: Any) -> float:
    """A float from config JSON: a number, "Infinity", or transformers' {"__float__": "Infinity"}."""
    if isinstance(v, dict):
        v = v.get("__float__")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise CheckpointError(f"config.json has a non-numeric time_step_limit entry {v!r}") from None


def _rows_llamba_to_canonical(w: torch.Tensor, c: LaplaceConfig) -> torch.Tensor:
    """in_proj rows (x, B, C, z, a) -> (z, x, B, C, a)."""
    xbc, z, a = w.split([c.conv_dim, c.value_dim, c.n_heads], dim=0)
    return torch.cat([z, xbc, a], dim=0)


def map_weights(family: str, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[LaplaceConfig, dict[str, torch.Tensor]]:
    """(our config, our state dict) from a checkpoint's config and tensors. Every source
    tensor must be used, and every shape must fit: otherwise a CheckpointError."""
    src = dict(tensors)
    if family == "llamba":
        emb = take(src, "backbone.embedding.weight")
        config = llamba_config(cfg, emb.shape[0])
        attn_norm, final = "input_layernorm", "backbone.final_layernorm.weight"
    else:
        emb = src.pop("backbone.embeddings.weight", None)
        emb = emb if emb is not None else take(src, "backbone.embedding.weight")
        tied = "lm_head.weight" not in src or bool(cfg.get("tie_word_embeddings", False)) and torch.equal(src["lm_head.weight"], emb)
        config = mamba2_config(cfg, emb.shape[0], tied)
        attn_norm, final = "norm", "backbone.norm_f.weight"
        if tied:
            src.pop("lm_head.weight", None)
    c = config
    out: dict[str, torch.Tensor] = {"embed.weight": emb, "norm.weight": expect_shape(final, take(src, final), (c.d_model,))}
    if not c.tie_embeddings:
        out["lm_head.weight"] = expect_shape("lm_head.weight", take(src, "lm_head.weight"), (c.vocab_size, c.d_model))
    reorder: Callable[[torch.Tensor], torch.Tensor] = (lambda w: _rows_llamba_to_canonical(w, c)) if family == "llamba" else (lambda w: w)
    mix = "mixer."
    for i in range(c.n_layers):
        p, q = f"backbone.layers.{i}.", f"blocks.{i}."

        def get(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
            t = take(src, p + name)
            return t if shape is None else expect_shape(p + name, t, shape)

        out[q + "attn_norm.weight"] = get(attn_norm + ".weight", (c.d_model,))
        out[q + "attn.in_proj.weight"] = reorder(get(mix + "in_proj.weight", (c.in_proj_dim(), c.d_model)))
        if c.proj_bias:
            out[q + "attn.in_proj.bias"] = reorder(get(mix + "in_proj.bias"))
            out[q + "attn.out_proj.bias"] = get(mix + "out_proj.bias")
        conv = get(mix + "conv1d.weight", (c.conv_dim, 1, c.conv_size))
        out[q + "attn.conv.weight"] = conv[:, 0, :]
        if c.conv_bias:
            out[q + "attn.conv.bias"] = get(mix + "conv1d.bias")
        out[q + "attn.D"] = get(mix + "D", (c.n_heads,))
        out[q + "attn.out_proj.weight"] = get(mix + "out_proj.weight", (c.d_model, c.value_dim))
        if family == "llamba":
            zeros = torch.zeros(c.n_heads, dtype=torch.float32)
            out[q + "attn.A_log"], out[q + "attn.dt_bias"] = zeros, zeros.clone()  # decay = -softplus(a)
            z_bias = src.pop(p + mix + "z_bias", None)
            out[q + "attn.z_bias"] = z_bias if z_bias is not None else torch.zeros(c.value_dim)
            out[q + "ffn_norm.weight"] = get("post_attention_layernorm.weight", (c.d_model,))
            for ours, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                out[q + f"ffn.{ours}.weight"] = get(f"mlp.{theirs}.weight")
        else:
            out[q + "attn.A_log"] = get(mix + "A_log")
            out[q + "attn.dt_bias"] = get(mix + "dt_bias")
            out[q + "attn.norm_weight"] = get(mix + "norm.weight")
    if src:
        raise CheckpointError(f"the checkpoint has tensors this architecture does not use: {', '.join(sorted(src)[:4])}; it is not a plain {family} model")
    return config, out
