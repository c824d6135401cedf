"""The app factory: the one way to build the TUI (the CLI, tests and the benchmark use it).

`laplace chat` (agent/cli/chat.py `chat`) checks the keymap file (`load_keymap`), opens the
service and its session (`open_service`, which hands back a `StateUnusableError` instead of
raising it so the app can offer a rebuild), then calls `create_app(service, keymap=...,
startup_error=...)` and runs it; the caller owns the service and closes it and its store.
"""

from __future__ import annotations

from typing import Mapping

from agent.chat.types import ChatServiceProtocol, StateUnusableError

from .app import LaplaceApp, binding_scopes, known_bindings
from .keymap import refuse_clashes, validate_keymap


def known_binding_ids() -> list[str]:
    """Every id a keymap may name."""
    return list(known_bindings())


def checked_keymap(keymap: Mapping[str, object] | None) -> dict[str, str]:
    """A keymap's ids and keys checked (`validate_keymap`), and no key given to two bindings
    that work at the same time; ValueError naming the problem otherwise."""
    clean = validate_keymap(keymap, known_binding_ids())
    refuse_clashes(clean, known_bindings(), binding_scopes())
    return clean


def create_app(
    service: ChatServiceProtocol,
    *,
    keymap: Mapping[str, object] | None = None,
    startup_error: StateUnusableError | None = None,
    page_size: int = 50,
    max_turn_widgets: int = 150,
    latencies: list[float] | None = None,
) -> LaplaceApp:
    """Build the TUI for `service`.

    keymap: `{binding_id: "key[,key]"}` (e.g. the `[keys]` table of a TOML file); unknown
        ids, bad keys and clashing bindings raise ValueError naming the problem.
    startup_error: the `StateUnusableError` that `service.resume` raised; the app then asks
        whether to rebuild the state by replaying the transcript (or quit).
    page_size / max_turn_widgets: turns fetched per page and the bound on turn widgets.
    latencies: if given, receives per-token seconds from event to document (benchmark).
    """
    clean = checked_keymap(keymap)
    return LaplaceApp(service, keymap=clean, startup_error=startup_error, page_size=page_size,
                      max_turn_widgets=max_turn_widgets, latencies=latencies)
