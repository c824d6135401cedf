"""Muon for the 2-D block matrices: momentum, Newton-Schulz orthogonalization, scaled step.

Why not `torch.optim.Muon`: in torch 2.13 it always runs Newton-Schulz in bf16, which on
CPUs without bf16 hardware is ~100x slower than fp32. Here the Newton-Schulz dtype comes
from the device (`agent.runtime.device.matmul_dtype`: bf16 on GPU/Trainium and on a CPU
where a short timing finds bf16 matmuls at least as fast as fp32, else fp32); with `ns_dtype=torch.bfloat16` every step matches `torch.optim.Muon`
bit for bit (tested). The iteration, its quintic coefficients and eps are torch's.

The learning-rate scaling is explicit (`adjust_lr`): "match_rms_adamw" (Moonshot's
0.2 * sqrt(max(A, B))) gives the orthogonalized update the RMS of an AdamW update, so one
learning rate serves both optimizers; "original" is Keller Jordan's sqrt(max(1, A / B)).

Parameters may be plain tensors or FSDP2 DTensors sharded on dim 0. Momentum and weight
decay are elementwise, so they run on local shards; orthogonalization needs whole matrices
and goes through `agent.train.dist_muon.orthogonalize_sharded` (two all_to_alls).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import Tensor

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim._muon DEFAULT_A, _B, _C
NS_STEPS = 5
NS_EPS = 1e-7
ADJUST_LR_CHOICES = ("match_rms_adamw", "original", "none")


def newton_schulz(
    grad: Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    steps: int = NS_STEPS,
    eps: float = NS_EPS,
) -> Tensor:
    """Approximately orthogonalize a 2-D matrix (U S' V^T with S' ~ 1), in `dtype`.

    Op for op the same as torch's `_zeropower_via_newtonschulz`, with the dtype a parameter."""
    if grad.dim() != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix, got shape {tuple(grad.shape)}")
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    # A fresh tensor (not a view of `grad`) before the in-place division, as in torch.
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, gram_update, x, beta=a)
    return x.T if tall else x


def adjust_lr(lr: float, mode: str, shape: tuple[int, ...] | torch.Size) -> float:
    """The per-matrix learning rate Muon applies (see module docstring)."""
    rows, cols = shape[0], shape[1]
    if mode == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    if mode == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if mode == "none":
        return lr
    raise ValueError(f"unknown Muon lr adjustment {mode!r}; choose one of {', '.join(ADJUST_LR_CHOICES)}")


def _local(t: Tensor) -> Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class Muon(torch.optim.Optimizer):
    """Muon (momentum + Newton-Schulz) over 2-D matrices, plain or FSDP2-sharded on dim 0.

    `ns_dtype`: dtype of the Newton-Schulz matmuls (pass `matmul_dtype(device)`).
    `process_group`: set when the parameters are sharded DTensors; whole matrices are then
    orthogonalized by one owner rank each (`dist_muon`). `comm_log`, if given, receives the
    bytes each all_to_all sent to other ranks (for the traffic measurements)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        *,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        adjust_lr_fn: str = "match_rms_adamw",
        ns_dtype: torch.dtype = torch.float32,
        ns_steps: int = NS_STEPS,
        eps: float = NS_EPS,
        process_group: Any = None,
        comm_log: list[dict[str, int]] | None = None,
    ) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Muon learning rate must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        adjust_lr(1.0, adjust_lr_fn, (1, 1))  # validates the mode name
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon only takes 2-D matrices; got a parameter of shape {tuple(p.shape)}")
        self.ns_dtype = ns_dtype
        self.ns_steps = ns_steps
        self.eps = eps
        self.process_group = process_group
        self.comm_log = comm_log

    def _orthogonalize(self, updates: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        if self.process_group is None:
            return [newton_schulz(u, dtype=self.ns_dtype, steps=self.ns_steps, eps=self.eps) for u in updates]
        from agent.train.dist_muon import orthogonalize_sharded

        out, sent = orthogonalize_sharded(
            updates, shapes, group=self.process_group, ns=lambda m: newton_schulz(m, dtype=self.ns_dtype, steps=self.ns_steps, eps=self.eps)
        )
        if self.comm_log is not None:
            self.comm_log.append(sent)
        return out

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, updates, shapes = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = _local(p.grad)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    # Laid out like the gradient (a DTensor under FSDP2, so a checkpoint
                    # can gather it whole); the arithmetic below runs on the local shard.
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = _local(state["momentum_buffer"])
                buf.lerp_(grad, 1 - group["momentum"])
                updates.append(grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf)
                params.append(p)
                shapes.append(p.shape)  # the whole matrix's shape, also for a DTensor
            if not params:
                continue
            lr, wd = group["lr"], group["weight_decay"]
            for p, shape, o in zip(params, shapes, self._orthogonalize(updates, shapes)):
                local = _local(p)
                local.mul_(1 - lr * wd)
                local.add_(o, alpha=-adjust_lr(lr, group["adjust_lr_fn"], shape))
        return loss
