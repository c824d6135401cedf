"""The trained parameters that ship with laplace for the default model, and whether a built
default is up to date with them, without torch.

Every `laplace ask` on the default model asks `shipped_changes` before it loads anything:
config.json's card and the small shipped files' sha256. Only when they differ does the torch
updater (`default_model.update_shipped`) load and rewrite the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from agent.importers.download import sha256_of
from agent.runtime.modeldir import PACKAGED_MODELS, ModelLoadError, read_config

SHIPPED = PACKAGED_MODELS / "smollm2"
BRANCH_FILE = "gla_branch.safetensors"  # replaces the branch's initial parameters
DELTA_FILE = "answer_delta.safetensors"  # added to the teacher's weights ("add" or "lora")
# The shipped files in the order they are applied, each with the delta formats it may hold.
SHIPPED_FILES = ((BRANCH_FILE, ("replace",)), (DELTA_FILE, ("add", "lora")))
# Config fields the default takes after the files (its memory of evicted tokens, issue 37): a
# JSON object of SETTING_KEYS, applied and taken out as the files are (its card record keeps
# the values it replaced, under "was"); and CARD_KEYS, which go into the model card instead
# (the recall its state was measured to keep, from which chat takes its recall horizon).
SETTINGS_FILE = "settings.json"
SETTINGS_FORMAT = "settings"
SETTING_KEYS = ("memory_slots", "memory_policy", "memory_layers", "memory_rest_slots", "memory_distance", "memory_rest_distance")
CARD_KEYS = ("recall_measured",)


class DefaultModelError(Exception):
    """The default model cannot be built here (offline, a bad download, a bad shipped file)."""


def describe_shipped(records: list[dict[str, Any]]) -> str:
    """The card's "shipped" records in words: `answer_delta.safetensors (lora, 60 tensors,
    sha256 1a2b3c4d…)`, `settings.json (memory_slots=224, memory_policy=novelty, sha256 …)`,
    or none."""
    def one(r: dict[str, Any]) -> str:
        if r.get("format") == SETTINGS_FORMAT and isinstance(r.get("values"), dict):
            keys = sorted(r["values"], key=lambda k: (SETTING_KEYS.index(k) if k in SETTING_KEYS else len(SETTING_KEYS), k))
            what = ", ".join(f"{k}={r['values'][k]}" if k in SETTING_KEYS else f"{k} (card)" for k in keys)
        else:
            what = f"{r.get('format')}, {r.get('tensors')} tensors"
        return f"{r.get('file')} ({what}, sha256 {str(r.get('sha256'))[:8]}…)"

    return ", ".join(map(one, records)) or "none"


def applied_records(model_dir: Path) -> Optional[list[dict[str, Any]]]:
    """The shipped records of a default `default_model` built; None for any other directory
    (a model a user imported as "default" has no "shipped", and is not ours to change)."""
    try:
        _, card = read_config(model_dir)
    except ModelLoadError:
        return None  # loading it says what is wrong
    records = card.get("shipped")
    if not isinstance(records, list) or not all(isinstance(r, dict) and {"file", "format", "sha256"} <= set(r) for r in records):
        return None
    return records


def shipped_changes(model_dir: Path, shipped: Optional[Path] = None) -> Optional[str]:
    """What differs between the shipped files applied to the built default `model_dir` and
    the ones in `shipped` (default: the ones this laplace ships): "answer_delta.safetensors
    changed, ...", or None when they are the same. Cheap enough for every use: config.json
    and the small shipped files' sha256, nothing cached. Raises DefaultModelError for a
    shipped file it cannot read."""
    shipped = SHIPPED if shipped is None else Path(shipped)
    records = applied_records(model_dir)
    if records is None:
        return None
    order = [name for name, _ in SHIPPED_FILES] + [SETTINGS_FILE]
    try:
        now = {name: sha256_of(shipped / name) for name in order if (shipped / name).is_file()}
    except OSError as exc:
        raise DefaultModelError(f"a shipped file is unreadable ({exc}); reinstall laplace") from None
    was = {r["file"]: r["sha256"] for r in records}
    differ = sorted((f for f in set(was) | set(now) if was.get(f) != now.get(f)),
                    key=lambda f: (order.index(f) if f in order else len(order), f))
    return ", ".join(f"{f} {'added' if f not in was else 'removed' if f not in now else 'changed'}" for f in differ) or None


def read_settings(path: Path) -> dict[str, Any]:
    """The shipped settings file: a JSON object whose keys are among SETTING_KEYS (each value
    is checked by the config it goes into) and CARD_KEYS (checked here). DefaultModelError,
    naming the file, otherwise."""
    from agent.runtime.card import check_measured  # torch-free

    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DefaultModelError(f"the shipped {path} is unreadable ({exc}); reinstall laplace") from None
    if not isinstance(values, dict) or not values or not set(values) <= set(SETTING_KEYS + CARD_KEYS):
        raise DefaultModelError(f"the shipped {path} is not a JSON object of {', '.join(SETTING_KEYS + CARD_KEYS)}; "
                                "reinstall laplace")
    if "recall_measured" in values:
        try:
            check_measured(values["recall_measured"])
        except ValueError as exc:
            raise DefaultModelError(f"the shipped {path} is not usable ({exc}); reinstall laplace") from None
    return values


def describe_memory(slots: int, policy: str, layers: Sequence[int] = (), n_layers: int = 0, rest: int = 0, distance: int = 0,
                    rest_distance: int = 0) -> str:
    """A config's memory of evicted tokens in words: "224 slots (novelty)", "768 slots
    (novelty) in 13 of 30 layers (11, 14, ...)", "... and 216 in the other 17", "..., read
    at distance 512" (`memory_distance`; 0: at the window's edge, unsaid), or "none". With
    `rest_distance` (`memory_rest_distance`) each group says its own: "... (11, 14, ...),
    read at distance 512, and 216 in the other 17, read at the window's edge"."""
    if not slots:
        return "none"
    of = f" of {n_layers}" if n_layers else ""
    where = f" in {len(layers)}{of} layers ({', '.join(map(str, layers))})" if layers else ""
    others = f" the other {n_layers - len(layers)}" if n_layers else " each other layer"
    two = bool(rest and layers)
    if two and rest_distance:
        def at(d: int) -> str:
            return f", read at distance {d}" if d else ", read at the window's edge"
        return f"{slots} slots ({policy}){where}{at(distance)}, and {rest} in{others}{at(rest_distance)}"
    return (f"{slots} slots ({policy}){where}" + (f" and {rest} in{others}" if two else "")
            + (f", read at distance {distance}" if distance else ""))


def parse_layers(text: str) -> tuple[int, ...]:
    """"11,14-18" -> (11, 14, 15, 16, 17, 18): layer indices, ascending; ValueError otherwise."""
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a list of layers like 11,14-18")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise ValueError(f"{part.strip()!r} runs backwards")
        out.update(range(a, b + 1))
    return tuple(sorted(out))
