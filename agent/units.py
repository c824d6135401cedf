"""Human-readable sizes: the one formatter every command and the TUI use."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Decimal units, as the product promises them ("29.5 MB", "1.5 kB", "512 B")."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover
