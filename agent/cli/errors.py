"""What every `laplace` command writes on stderr: bad input as a single line (exit 1), and
progress lines (redrawn in place on a terminal, plain lines now and then elsewhere)."""

from __future__ import annotations

import sys
import time

import typer

from agent.display import displayable


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` to stderr and return the Exit for the caller to raise.

    Messages often quote user input or stored names, so control characters are made visible."""
    typer.echo(f"error: {displayable(message)}", err=True)
    return typer.Exit(code)


# To a file or a pipe (a log, CI) a bar is a plain line now and then, not a carriage return
# per update: one at the start, then at every PLAIN_STEP of the total or PLAIN_EVERY_S
# seconds, whichever comes first, and one at the end.
PLAIN_STEP = 0.1
PLAIN_EVERY_S = 10.0
_plain_last: dict[str, tuple[float, float]] = {}  # label -> (clock, fraction) of its last plain line


def _stderr_is_terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_line(label: str, done: int, total: int, amount: str | None = None) -> None:
    """One progress line on stderr: redrawn in place on a terminal, a plain line now and
    then (see PLAIN_STEP) in a file or pipe; `amount` replaces "done/total"."""
    width = 30
    frac = min(1.0, done / max(total, 1))
    filled = int(width * frac)
    line = f"{label} [{'#' * filled}{'.' * (width - filled)}] {amount or f'{done}/{total}'}"
    finished = done >= total
    if _stderr_is_terminal():
        typer.echo("\r" + line, err=True, nl=finished)
        return
    now = time.monotonic()
    last = _plain_last.get(label)
    if last is None or finished or frac - last[1] >= PLAIN_STEP or now - last[0] >= PLAIN_EVERY_S:
        typer.echo(line, err=True)
        _plain_last[label] = (now, frac)
    if finished:
        _plain_last.pop(label, None)
