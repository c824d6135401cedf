"""Turning logits into a token: greedy, temperature, top-k, top-p, repetition penalty.

Sampling always takes an explicit, seeded `torch.Generator`; temperature 0 is greedy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import Tensor


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Recall refresh (agent/recall/), stored with the session like the rest: on or off,
    # the most tokens a recall block may add per turn, and the horizon in tokens beyond
    # which a turn counts as faded (0: derive it from the model).
    refresh: bool = True
    refresh_tokens: int = 256
    refresh_horizon: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.refresh_tokens < 16:
            raise ValueError(f"refresh_tokens must be >= 16 (a recall block's header alone takes ~10), got {self.refresh_tokens}")
        if self.refresh_horizon < 0:
            raise ValueError(f"refresh_horizon must be >= 0 tokens (0: derived from the model), got {self.refresh_horizon}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingOptions":
        data = dict(data)
        if "stop" in data:
            data["stop"] = tuple(data["stop"])
        return cls(**data)

    def with_pairs(self, pairs: Iterable[tuple[str, str]]) -> "SamplingOptions":
        """Apply `-o KEY VALUE` pairs from the command line, validated by name and type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in pairs:
            key = key.replace("-", "_")
            if key not in fields:
                raise ValueError(f"unknown sampling option {key!r}; known: {', '.join(sorted(fields))}")
            try:
                if key == "stop":
                    changes["stop"] = tuple(changes.get("stop", self.stop)) + (raw,)
                elif key == "seed":
                    changes[key] = None if raw.lower() == "none" else int(raw)
                elif key == "refresh":
                    changes[key] = _switch(raw)
                elif key in ("top_k", "max_new_tokens", "refresh_tokens", "refresh_horizon"):
                    changes[key] = int(raw)
                else:
                    changes[key] = float(raw)
            except ValueError:
                if key == "refresh":
                    raise ValueError(f"option refresh is on or off, got {raw!r}") from None
                raise ValueError(f"sampling option {key} needs a number, got {raw!r}") from None
        return dataclasses.replace(self, **changes)


def _switch(raw: object) -> bool:
    """on/off (also true/false, yes/no, 1/0, and the stored JSON booleans)."""
    text = str(raw).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise ValueError(text)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def apply_repetition_penalty(logits: Tensor, history: Tensor | None, penalty: float) -> Tensor:
    """CTRL-style: divide positive logits of seen tokens by `penalty`, multiply negative ones."""
    if history is None or penalty == 1.0 or history.numel() == 0:
        return logits
    seen = logits.gather(-1, history)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(-1, history, seen)


def sample(logits: Tensor, opts: SamplingOptions, generator: torch.Generator, history: Tensor | None = None) -> Tensor:
    """logits [B, vocab] -> token ids [B]. `history` [B, N] are tokens to penalize."""
    logits = apply_repetition_penalty(logits.float(), history, opts.repetition_penalty)
    if opts.temperature == 0:
        return logits.argmax(-1)
    logits = logits / opts.temperature
    if opts.top_k:
        kth = logits.topk(min(opts.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if opts.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = probs.cumsum(-1) - probs >= opts.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(-1).to(logits.device)
