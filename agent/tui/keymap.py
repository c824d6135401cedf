"""Remappable key bindings: every binding the user may remap has an id, and a keymap is a
plain `{binding_id: "key[,key...]"}` dict (the CLI reads it from the `[keys]` table of a TOML
file). Validation is pure, so a typo in the user's file fails with a clear message before
the app starts instead of being silently ignored.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from textual.binding import Binding, BindingType


def binding_ids(groups: Iterable[Iterable[BindingType]]) -> dict[str, Binding]:
    """Map id -> Binding over several BINDINGS lists (bindings without an id are skipped)."""
    out: dict[str, Binding] = {}
    for bindings in groups:
        for b in bindings:
            if isinstance(b, Binding) and b.id:
                out.setdefault(b.id, b)
    return out


def validate_keymap(keymap: Mapping[str, object] | None, known: Iterable[str]) -> dict[str, str]:
    """Check ids and values; return a clean `{id: keys}` dict for `App.set_keymap`."""
    if not keymap:
        return {}
    known_ids = set(known)
    clean: dict[str, str] = {}
    for key, value in keymap.items():
        if key not in known_ids:
            raise ValueError(f"unknown key binding id {key!r} in keymap; known ids: {', '.join(sorted(known_ids))}")
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"keymap entry {key!r} must be a key string like \"ctrl+r\" or \"f5,ctrl+r\"")
        clean[key] = ",".join(part.strip() for part in value.split(",") if part.strip())
    return clean


def bindings_markdown(bindings: Mapping[str, Binding], keymap: Mapping[str, str]) -> str:
    """A Markdown table of binding ids, their current keys and what they do."""
    lines = ["| id | keys | action |", "| --- | --- | --- |"]
    for bid, b in bindings.items():
        keys = keymap.get(bid, b.key)
        lines.append(f"| `{bid}` | `{keys}` | {b.description or b.action} |")
    return "\n".join(lines)
