"""The one way every `laplace` command reports bad input: a single line on stderr, exit 1."""

from __future__ import annotations

import typer


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` to stderr and return the Exit for the caller to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
