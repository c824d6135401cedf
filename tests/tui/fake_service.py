"""The fake chat service the TUI tests drive: `agent.tui.fake_service.FakeChatService`.

The implementation lives in the package because `laplace bench` measures the TUI with it;
this module re-exports it and adds builders the tests share.
"""

from __future__ import annotations

from agent.tui.fake_service import FakeChatService, default_reply

__all__ = ["FakeChatService", "default_reply", "fake_with_history"]


def fake_with_history(n_turns: int, *, token_delay: float = 0.0005) -> FakeChatService:
    """A fake whose current session already holds `n_turns` turns."""
    fake = FakeChatService(token_delay=token_delay)
    fake.add_history(n_turns)
    return fake
