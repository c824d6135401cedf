"""Remappable key bindings: every binding the user may remap has an id, and a keymap is a
plain `{binding_id: "key[,key...]"}` dict (the CLI reads it from the `[keys]` table of a TOML
file). Validation is pure, so a typo in the user's file fails with a clear message before
the app starts instead of being silently ignored.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from textual.binding import Binding, BindingType
from textual.keys import KEY_ALIASES, KEY_NAME_REPLACEMENTS, Keys, key_to_character

MODIFIERS = ("ctrl", "alt", "shift", "meta", "super", "hyper")
# Key names Textual reports (escape, f5, pageup, ...), the last part of each combination.
_NAMED_KEYS = {k.value.rpartition("+")[2] for k in Keys if not k.value.startswith("<")}
_NAMED_KEYS |= {"backtab", "newline", *KEY_ALIASES, *KEY_NAME_REPLACEMENTS.values()}
_NAMED_KEYS |= {a.rpartition("+")[2] for v in KEY_ALIASES.values() for a in v}


def key_problem(key: str) -> str | None:
    """Why `key` (e.g. "ctrl+shift+up") is not a key Textual can report, or None if it is."""
    *mods, base = key.split("+")
    unknown = [m for m in mods if m not in MODIFIERS]
    if unknown:
        return f"unknown modifier {unknown[0]!r} (modifiers: {', '.join(MODIFIERS)})"
    if len(set(mods)) != len(mods):
        return "a modifier is repeated"
    if not base:
        return "no key after the modifiers"
    if base in _NAMED_KEYS or (len(base) == 1 and base.isprintable() and not base.isspace()):
        return None
    if key_to_character(base) is not None:  # characters by name: question_mark, slash, ...
        return None
    return f"unknown key name {base!r} (e.g. a, f5, enter, escape, pageup, question_mark)"


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
        usage = f"keymap entry {key!r} must be a key string like {key} = \"ctrl+r\" or \"f5,ctrl+r\""
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{usage}, or a list of such strings; got {value!r}")
            value = ",".join(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{usage}; got {value!r}")
        keys = [part.strip() for part in value.split(",")]
        for name in keys:
            problem = key_problem(name) if name else "an empty key between commas"
            if problem:
                raise ValueError(f"keymap entry {key!r}: {name!r} is not a valid key: {problem}")
        clean[key] = ",".join(keys)
    return clean


def refuse_clashes(keymap: Mapping[str, str], bindings: Mapping[str, Binding], scopes: Iterable[Iterable[str]]) -> None:
    """Raise ValueError when, with `keymap` applied over the defaults, one key would mean two
    bindings that are active at the same time (each scope: ids that can fire together)."""
    for scope in scopes:
        owner: dict[str, str] = {}
        for bid in scope:
            for key in (k.strip() for k in keymap.get(bid, bindings[bid].key).split(",")):
                other = owner.setdefault(key, bid)
                if other != bid:
                    first, second = (bid, other) if bid in keymap else (other, bid)
                    raise ValueError(f"keymap: {first!r} and {second!r} would both take {key!r}, and both work at "
                                     "the same time; give one of them another key")


def bindings_markdown(bindings: Mapping[str, Binding], keymap: Mapping[str, str]) -> str:
    """A Markdown table of binding ids, their current keys and what they do."""
    lines = ["| id | keys | action |", "| --- | --- | --- |"]
    for bid, b in bindings.items():
        keys = keymap.get(bid, b.key)
        lines.append(f"| `{bid}` | `{keys}` | {b.description or b.action} |")
    return "\n".join(lines)
