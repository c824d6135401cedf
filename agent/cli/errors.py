"""What every `laplace` command writes on stderr: bad input as a single line (exit 1), and
progress lines redrawn in place."""

from __future__ import annotations

import typer

from agent.display import displayable


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` to stderr and return the Exit for the caller to raise.

    Messages often quote user input or stored names, so control characters are made visible."""
    typer.echo(f"error: {displayable(message)}", err=True)
    return typer.Exit(code)


def progress_line(label: str, done: int, total: int, amount: str | None = None) -> None:
    """One progress line on stderr, redrawn in place; `amount` replaces "done/total"."""
    width = 30
    filled = int(width * done / max(total, 1))
    typer.echo(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {amount or f'{done}/{total}'}", err=True, nl=done >= total)
