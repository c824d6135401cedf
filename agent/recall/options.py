"""A session's recall refresh settings: on or off, the block's token budget, the horizon.

Stored with the session like its sampling options (`-o refresh off`, `-o refresh_tokens N`,
`-o refresh_horizon N`); the chat service owns and parses them (agent/chat/options.py).
Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.recall.rule import DEFAULT_BUDGET

MIN_TOKENS = 16  # a recall block's header alone takes ~10


@dataclass(frozen=True, kw_only=True)
class RefreshOptions:
    """`on`: fold recall blocks at all; `tokens`: the most a block may add per turn,
    template tokens included; `horizon`: tokens beyond which a turn counts as faded (0: the
    model's, `agent.recall.horizon.recall_horizon`)."""

    on: bool = True
    tokens: int = DEFAULT_BUDGET
    horizon: int = 0

    def __post_init__(self) -> None:
        if self.tokens < MIN_TOKENS:
            raise ValueError(f"refresh_tokens must be >= {MIN_TOKENS} (a recall block's header alone takes ~10), got {self.tokens}")
        if self.horizon < 0:
            raise ValueError(f"refresh_horizon must be >= 0 tokens (0: derived from the model), got {self.horizon}")
