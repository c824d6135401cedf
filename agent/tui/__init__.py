"""Laplace's Textual TUI. Build it with `create_app(service, ...)`; it talks to the chat
service only through `agent.chat.types.ChatServiceProtocol` and never imports the runtime,
torch or the session store."""

from __future__ import annotations

from .factory import create_app, known_binding_ids

__all__ = ["create_app", "known_binding_ids"]
