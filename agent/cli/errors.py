"""The one way every `laplace` command reports bad input: a single line on stderr, exit 1."""

from __future__ import annotations

import typer

from agent.display import displayable


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` to stderr and return the Exit for the caller to raise.

    Messages often quote user input or stored names, so control characters are made visible."""
    typer.echo(f"error: {displayable(message)}", err=True)
    return typer.Exit(code)
