"""A session's options, with one owner: how replies are sampled and how recall refresh runs.

Text from the user (`-o KEY VALUE` on the command line, `/set KEY VALUE` in chat) is parsed
here, once, into typed values; a session stores what differs from the defaults as JSON
with those types (floats, ints, bools, a list for `stop`). `ChatService` holds the live
`SessionOptions` and writes them whenever they change. Databases written before options
were stored typed may hold strings ("0.2", "off"): `with_values` reads a string as if it
had been typed on the command line, and the service stores it typed on resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from agent.recall.options import RefreshOptions
from agent.runtime.sampling import SamplingOptions

# Each option as the user names it -> (the part that reads it, its field there, its kind).
KEYS: dict[str, tuple[str, str, str]] = {
    "temperature": ("sampling", "temperature", "float"),
    "top_k": ("sampling", "top_k", "int"),
    "top_p": ("sampling", "top_p", "float"),
    "repetition_penalty": ("sampling", "repetition_penalty", "float"),
    "max_new_tokens": ("sampling", "max_new_tokens", "int"),
    "seed": ("sampling", "seed", "seed"),
    "stop": ("sampling", "stop", "stop"),
    "refresh": ("refresh", "on", "switch"),
    "refresh_tokens": ("refresh", "tokens", "int"),
    "refresh_horizon": ("refresh", "horizon", "int"),
}
SWITCH = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class SessionOptions:
    """The live options of a session: `sampling` for the runtime, `refresh` for recall."""

    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    refresh: RefreshOptions = field(default_factory=RefreshOptions)

    def value(self, key: str) -> object:
        part, name, _ = KEYS[key]
        return getattr(getattr(self, part), name)

    def with_values(self, values: Mapping[str, object]) -> SessionOptions:
        """These options with `values` set (typed, as stored or parsed; a string is parsed as
        command-line text). Raises ValueError naming the option."""
        changes: dict[str, dict[str, object]] = {"sampling": {}, "refresh": {}}
        for key, raw in values.items():
            key = _known(key)
            part, name, kind = KEYS[key]
            changes[part][name] = _typed(key, kind, raw)
        return SessionOptions(sampling=replace(self.sampling, **changes["sampling"]),  # type: ignore[arg-type]
                              refresh=replace(self.refresh, **changes["refresh"]))  # type: ignore[arg-type]

    def with_text(self, pairs: Iterable[tuple[str, str]]) -> SessionOptions:
        """These options with `/set KEY VALUE` pairs applied; `stop` adds a stop string."""
        values = parse_pairs(pairs)
        if "stop" in values:
            values["stop"] = [*self.sampling.stop, *values["stop"]]  # type: ignore[misc]
        return self.with_values(values)

    def stored(self) -> dict[str, object]:
        """What differs from the defaults, keyed like `-o`, as JSON-typed values."""
        default = SessionOptions()
        out: dict[str, object] = {}
        for key in KEYS:
            value = self.value(key)
            if value != default.value(key):
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


def parse_pairs(pairs: Iterable[tuple[str, str]]) -> dict[str, object]:
    """`-o KEY VALUE` text as typed values, checked by name and type; `stop` may repeat
    (each adds a stop string). Raises ValueError naming the option."""
    out: dict[str, object] = {}
    for key, raw in pairs:
        key = _known(key)
        if key == "stop":
            out["stop"] = [*out.get("stop", []), raw]  # type: ignore[misc]
        else:
            out[key] = _typed(key, KEYS[key][2], raw)
    SessionOptions().with_values(out)  # ranges too (temperature >= 0, ...), before anything runs
    return out


def _known(key: str) -> str:
    key = key.replace("-", "_")
    if key not in KEYS:
        raise ValueError(f"unknown sampling option {key!r}; known: {', '.join(sorted(KEYS))}")
    return key


def _typed(key: str, kind: str, raw: object) -> object:
    """`raw` as the option's type: JSON values pass when they have it, text is parsed."""
    if kind == "stop":
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise ValueError(f"option stop is a list of strings, got {raw!r}")
        return tuple(items)
    if kind == "switch":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in SWITCH:
            return SWITCH[raw.strip().lower()]
        raise ValueError(f"option refresh is on or off, got {raw!r}")
    if kind == "seed" and (raw is None or (isinstance(raw, str) and raw.strip().lower() == "none")):
        return None
    try:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise ValueError
        if kind == "float":
            return float(raw)
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError
        return int(raw)
    except ValueError:
        raise ValueError(f"sampling option {key} needs a number, got {raw!r}") from None
