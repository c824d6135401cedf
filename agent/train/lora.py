"""Low-rank adapters (`laplace finetune --tune lora`): train a small delta, not the model.

`attach_lora` swaps chosen `nn.Linear` modules of a model for `LoRALinear`, which keeps the
linear's weight frozen and adds scale * B(A(x)), with B starting at zero (the model starts
exactly as it was). `lora_delta` turns the trained pairs into a "lora" delta file's tensors
(agent/runtime/delta.py), the scale folded into B, and `merged_state_dict` gives the plain
model's weights with the delta added, so the output stays a model directory `chat -m` loads.

Default targets leave q_proj and k_proj alone: they set where the window attends, and the
GLA branch is distilled against the teacher's q/k attention separately.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DEFAULT_TARGETS = ("v_proj", "o_proj", "w1", "w2", "w3")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "w1", "w2", "w3")


class LoRALinear(nn.Module):
    """y = x W^T + scale * (x A^T) B^T; W frozen, A [r, in] and B [out, r] trained.

    The frozen weight keeps the name `weight`, so the wrapped model's state_dict keys of the
    base weights are those of the plain model."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if base.bias is not None:
            raise ValueError("LoRALinear wraps bias-free linears only")
        self.weight = nn.Parameter(base.weight.detach(), requires_grad=False)
        out_f, in_f = base.weight.shape
        self.rank, self.scale = rank, alpha / rank
        a = torch.empty(rank, in_f, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)  # as nn.Linear, the usual LoRA init
        self.lora_A = nn.Parameter(a.to(base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(out_f, rank, device=base.weight.device))

    def forward(self, x: Tensor) -> Tensor:
        low = F.linear(F.linear(x, self.lora_A.to(x.dtype)), self.lora_B.to(x.dtype))
        return F.linear(x, self.weight) + self.scale * low

    def delta(self) -> Tensor:
        """The weight change this adapter stands for: scale * B @ A, [out, in]."""
        return self.scale * (self.lora_B.detach().float() @ self.lora_A.detach().float())


def attach_lora(model: nn.Module, *, targets: tuple[str, ...] = DEFAULT_TARGETS, rank: int = 8, alpha: float = 16.0,
                seed: int = 0, ranks: dict[str, int] | None = None) -> dict[str, LoRALinear]:
    """Freeze every parameter of `model` and wrap each `nn.Linear` whose attribute name is in
    `targets` in place; returns {module path: adapter}. `ranks` gives some targets their own
    rank (each adapter's scale is alpha / its rank). Raises if nothing matched."""
    unknown = set(targets) - set(LORA_TARGETS)
    if unknown:
        raise ValueError(f"unknown LoRA target(s) {', '.join(sorted(unknown))}; choose from {', '.join(LORA_TARGETS)}")
    ranks = {t: rank for t in targets} | dict(ranks or {})
    if min(ranks.values(), default=rank) < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {min(ranks.values())}")
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in targets]
    if not found:
        raise ValueError(f"no linear named {', '.join(targets)} in this model")
    adapters: dict[str, LoRALinear] = {}
    for name, lin in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        adapter = LoRALinear(lin, ranks[attr], alpha, gen)
        setattr(parent, attr, adapter)
        adapters[name] = adapter
    return adapters


def lora_delta(adapters: dict[str, LoRALinear]) -> dict[str, Tensor]:
    """A "lora" delta file's tensors: `<name>.weight.lora_A` and `.lora_B`, B holding the scale."""
    out: dict[str, Tensor] = {}
    for name, ad in adapters.items():
        out[f"{name}.weight.lora_A"] = ad.lora_A.detach().float().cpu().contiguous()
        out[f"{name}.weight.lora_B"] = (ad.scale * ad.lora_B.detach().float()).cpu().contiguous()
    return out


def load_lora_delta(adapters: dict[str, LoRALinear], tensors: dict[str, Tensor], *, partial: bool = False) -> list[str]:
    """Set the adapters from a delta written by `lora_delta` (a resumed run); returns the
    names set. With `partial`, adapters the delta has no pair for keep their fresh start (B
    at zero), so a run can begin from an earlier run's adapters and add targets; a pair with
    no adapter to take it is an error either way, never silently dropped."""
    keys = {k.rsplit(".weight.lora_", 1)[0] for k in tensors}
    extra = sorted(keys - set(adapters))
    if extra:
        raise ValueError(f"the delta adapts {extra[0]} (and {len(extra) - 1} more), which this run does not; add its target to --lora-targets")
    loaded: list[str] = []
    for name, ad in adapters.items():
        a, b = tensors.get(f"{name}.weight.lora_A"), tensors.get(f"{name}.weight.lora_B")
        if a is None or b is None:
            if partial:
                continue
            raise ValueError(f"{name}: the saved delta has no adapter for it")
        if a.shape != ad.lora_A.shape or b.shape != ad.lora_B.shape:
            raise ValueError(f"{name}: saved adapter of rank {a.shape[0]} does not fit rank {ad.rank}")
        with torch.no_grad():
            ad.lora_A.copy_(a.float())
            ad.lora_B.copy_(b.float() / ad.scale)
        loaded.append(name)
    return loaded


def merged_state_dict(model: nn.Module, adapters: dict[str, LoRALinear]) -> dict[str, Tensor]:
    """The plain model's state_dict with every adapter's delta added to its weight."""
    sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items() if not k.endswith((".lora_A", ".lora_B"))}
    for name, ad in adapters.items():
        key = f"{name}.weight"
        sd[key] = (sd[key].float() + ad.delta().cpu()).to(sd[key].dtype)
    return sd
