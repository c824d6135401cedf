"""The transcript: message widgets and the bounded, paged view that holds them."""

from __future__ import annotations

from .messages import MessageWidget, StreamingMessage, code_blocks
from .view import ChatView

__all__ = ["ChatView", "MessageWidget", "StreamingMessage", "code_blocks"]
