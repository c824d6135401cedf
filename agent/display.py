"""Showing things in a terminal: model output made safe, and sizes for people.

Beside `settings.py`, the one place every command and the TUI format what they print.

A model can emit any byte, including ESC: written raw to a terminal, `ESC ]52;...` could
set the clipboard and other sequences can retitle, recolor or confuse it. Rich drops only a
few C0 controls, so everything we *display* passes through `displayable`, which shows C0
and C1 controls as visible symbols. Stored text is never altered. JSON output keeps the
data exact instead: `json_for_terminal` writes every control character as a `\\u` escape.
"""

from __future__ import annotations

import json
import re
from typing import Any

_KEEP = {"\n", "\t"}
_TABLE = {c: 0x2400 + c for c in range(0x20) if chr(c) not in _KEEP}  # ␀ … ␟ (␛ for ESC)
_TABLE[0x7F] = 0x2421  # ␡
_TABLE.update({c: 0xFFFD for c in range(0x80, 0xA0)})  # C1 controls (8-bit CSI and friends)


def displayable(text: str) -> str:
    """`text` with terminal control characters replaced by visible symbols (\\n and \\t kept)."""
    return text.translate(_TABLE)


# json.dumps escapes C0 controls itself; DEL and the C1 range would pass through raw.
_JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f]")


def json_for_terminal(data: Any, *, indent: int | None = 2) -> str:
    """JSON (indented, or one line with `indent=None`) with non-ASCII text kept readable and
    no raw control character in it.

    Outside strings JSON is plain ASCII, so escaping every match is always valid and lossless."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return _JSON_RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def human_bytes(n: float) -> str:
    """Decimal units, as the product promises them ("29.5 MB", "1.5 kB", "512 B")."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover
