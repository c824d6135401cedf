"""Training memory: recompute each block in backward, and say before a run if it won't fit.

Where a step's memory went (the default model, 135 M parameters, fp32, measured with
/proc/self/status VmHWM on one forward/backward): the window mixer keeps, per layer and
per token, the softmax scores of every query block against its ~W + S + chunk keys in
several forms (the q @ k products, the masked copy, the shifted copy, their exp) for
backward: about 130 kB per token per layer, 30 layers, so ~4 MB per token. 1,024 tokens x
4 rows at once was ~16 GB of activations before grads and optimizer state: the 24 GB kill.

The cure used here: per-block activation checkpointing (`enable_recompute`, non-reentrant
`torch.utils.checkpoint`) keeps only each block's input for backward and rebuilds one
block's activations at a time, at the cost of one extra forward (~1/3 more compute). With
one sequence per forward (grad accumulation over the step's rows) the activations of a
1,024-token step fall from ~16 GB to ~0.3 GB, and the rest is the fixed cost below.

`estimate_peak_bytes` is the arithmetic the trainer checks against the memory available
before it reads any data: weights, grads, optimizer state, the activations of one
micro-batch, and the logits of the loss. Its per-token constants are the measured ones
above; `laplace bench train-memory` compares the estimate with a measured peak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn
from torch.utils.checkpoint import checkpoint

# Floats kept per token and layer for backward, relative to the layer's widths (calibrated
# on the default model: ~8 score-sized tensors per window key, ~4 per FFN and model width).
SCORE_COPIES = 8
WIDTH_COPIES = 4
RUNTIME_BYTES = 450 * 2**20  # python + torch + tokenizer, before any weight (measured ~400-500 MB)
LOSS_CHUNK = 256  # positions whose logits exist at once in a training step's loss (Trainer.loss_sum)
FIT_MARGIN = 0.9  # use at most this share of the available memory
ACTIVATION_BUDGET = 1024 * 2**20  # the default micro-batch keeps one pass's activations + logits under this


def enable_recompute(model: nn.Module) -> int:
    """Wrap every block's forward in non-reentrant activation checkpointing, in place (the
    state_dict keys stay those of the plain model). Returns the number of blocks wrapped."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return 0
    for block in blocks:
        if getattr(block, "_recompute", False):
            continue
        inner = block.forward

        def forward(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            import torch

            if not torch.is_grad_enabled():  # eval: nothing is kept for backward anyway
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward  # an instance attribute: nn.Module.__call__ finds it first
        block._recompute = True
    return len(blocks)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes by part; `total` is the estimated peak RSS of the training process."""

    weights: int
    grads: int
    optimizer: int
    activations: int
    logits: int
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.runtime

    def describe(self) -> str:
        gb = lambda b: f"{b / 2**30:.1f}"  # noqa: E731
        return (f"~{gb(self.total)} GB (weights {gb(self.weights)}, grads {gb(self.grads)}, optimizer {gb(self.optimizer)}, "
                f"activations {gb(self.activations)}, logits {gb(self.logits)}, runtime {gb(self.runtime)})")


def estimate_peak_bytes(config: Any, *, n_params: int, trainable: int, muon: int, seq_len: int, micro: int,
                        recompute: bool, extra_weights: int = 0, chunked_loss: bool = True) -> MemoryEstimate:
    """The peak of one training step in fp32.

    n_params: the model's parameters; trainable: those with grads; muon: those Muon trains
    (one momentum buffer; AdamW keeps two per parameter); extra_weights: parameters held
    beside the model (LoRA adapters, a learned initial state); chunked_loss: the loss takes the
    logits LOSS_CHUNK positions at a time (one process; FSDP2 takes them whole)."""
    c = config
    keys = (c.window + c.sinks + c.chunk_size) if getattr(c, "mixer", "") == "window" else 2 * c.chunk_size
    per_layer_token = 4 * (SCORE_COPIES * c.n_heads * keys + WIDTH_COPIES * (c.ffn_dim + 2 * c.d_model))
    tokens = seq_len * micro
    if recompute:
        # Each block's input for all layers, plus one block rebuilt at a time (and its grads).
        act = tokens * (c.n_layers * 4 * c.d_model + 2 * per_layer_token)
    else:
        act = tokens * c.n_layers * per_layer_token
    # logits, log-softmax and their two grads, for at most LOSS_CHUNK positions a row at once
    # with the trainer's chunked loss (agent/train/loop.py), else for the whole row
    logits = micro * (min(seq_len, LOSS_CHUNK) if chunked_loss else seq_len) * c.vocab_size * 4 * 4
    adamw = trainable - muon
    return MemoryEstimate(weights=4 * (n_params + extra_weights), grads=4 * trainable, optimizer=4 * (muon + 2 * adamw),
                          activations=act, logits=logits)


def default_micro_batch(rows: int, estimate: Callable[[int], MemoryEstimate]) -> int:
    """The most rows per forward/backward (a divisor of the step's `rows`) whose activations
    and logits stay under ACTIVATION_BUDGET: a tiny model does the whole step at once, the
    default model one sequence at a time (grad accumulation: the same update)."""
    for micro in range(rows, 0, -1):
        est = estimate(micro)
        if rows % micro == 0 and est.activations + est.logits <= ACTIVATION_BUDGET:
            return micro
    return 1


def estimate_run(model: nn.Module, config: Any, *, tune: str, muon: bool, lora_rank: int | dict[str, int], lora_targets: tuple[str, ...],
                 seq_len: int, micro: int, recompute: bool, copied: bool, chunked_loss: bool = True) -> MemoryEstimate:
    """`estimate_peak_bytes` for a run of `laplace finetune` on `model`: what trains (every
    weight, LoRA adapters on `lora_targets`, or a learned initial state), whether Muon takes
    the block matrices, and whether the trainer works on a copy of the model (`copied`).
    `lora_rank` is one rank for every target or each target's own."""
    from agent.runtime.params import is_block_matrix

    n_params = sum(p.numel() for p in model.parameters())
    extra, muon_numel = 0, 0
    if tune == "all":
        trainable = n_params
        if muon:
            muon_numel = sum(p.numel() for n, p in model.named_parameters() if is_block_matrix(n, p))
    elif tune == "lora":
        rank_of = lora_rank if isinstance(lora_rank, dict) else dict.fromkeys(lora_targets, lora_rank)
        trainable = sum(rank_of[n.rsplit(".", 1)[-1]] * (m.in_features + m.out_features) for n, m in model.named_modules()
                        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in lora_targets)
        # + the merged weights written beside the delta at each save: freed after, but the
        # allocator keeps the pages, so RSS peaks as if they stayed (measured: +0.6 GB).
        extra = trainable + n_params
    else:
        trainable = extra = sum(t.numel() for t in model.new_state(1).tensors.values())
    if copied:
        extra += n_params
    return estimate_peak_bytes(config, n_params=n_params, trainable=trainable, muon=muon_numel, seq_len=seq_len, micro=micro,
                               recompute=recompute, extra_weights=extra, chunked_loss=chunked_loss)


def available_bytes() -> int | None:
    """Memory this process can still use: MemAvailable, or a cgroup limit if lower; None
    where neither can be read (then nothing is checked)."""
    override = os.environ.get("LAPLACE_TRAIN_MEMORY_GB")  # tests, and users who share the machine
    if override:
        return int(float(override) * 2**30)
    avail: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        return None
    for path, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                       ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = open(path, encoding="ascii").read().strip()
            if limit.isdigit() and int(limit) < 2**60:
                room = int(limit) - int(open(used, encoding="ascii").read().strip())
                avail = room if avail is None else min(avail, room)
            break
        except (OSError, ValueError):
            continue
    return avail


def fit_advice(est: MemoryEstimate, *, seq_len: int, micro: int, recompute: bool, tune: str) -> str:
    """The way out, most effective first."""
    ways = []
    if not recompute:
        ways.append("drop --no-recompute")
    if micro > 1:
        ways.append("--micro-batch 1")
    if est.activations + est.logits > est.total // 4 and seq_len > 256:
        ways.append(f"a smaller --seq-len (e.g. {max(256, seq_len // 2)})")
    if tune == "all":
        ways.append("--tune lora (no grads or optimizer state for the frozen weights)")
    return ", or ".join(ways) if ways else "a machine with more memory"
