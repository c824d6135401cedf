"""Making model output safe to show in a terminal.

A model can emit any byte, including ESC: written raw to a terminal, `ESC ]52;...` could
set the clipboard and other sequences can retitle, recolor or confuse it. Rich drops only a
few C0 controls, so everything we *display* passes through `displayable`, which shows C0
and C1 controls as visible symbols. Stored text is never altered.
"""

from __future__ import annotations

_KEEP = {"\n", "\t"}
_TABLE = {c: 0x2400 + c for c in range(0x20) if chr(c) not in _KEEP}  # ␀ … ␟ (␛ for ESC)
_TABLE[0x7F] = 0x2421  # ␡
_TABLE.update({c: 0xFFFD for c in range(0x80, 0xA0)})  # C1 controls (8-bit CSI and friends)


def displayable(text: str) -> str:
    """`text` with terminal control characters replaced by visible symbols (\\n and \\t kept)."""
    return text.translate(_TABLE)
