"""The README (and the docs pages it links) cannot drift from the CLI.

Every `laplace ...` line in a code block of README.md and docs/*.md must name real commands
and options and parse as the CLI parses it (placeholders such as ID or MODEL are just
strings to the parser); `--help` on it must exit 0. Every command in the README's table must
exist, with every flag the table shows. The README's cheap examples run for real against the
bundled demo model, in order, in the test's private LAPLACE_HOME.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from agent.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
CLI = typer.main.get_command(app)
# Run for real in the README's order: the demo model is 4.9 M parameters, so a few short
# turns take seconds. Anything else (the TUI, imports, servers, probes) gets --help only.
CHEAP = {("info",), ("sessions", "list"), ("ask",)}


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def laplace_commands(path: Path) -> list[list[str]]:
    """The argument lists of every line in a code block that runs `laplace` (also as
    `.venv/bin/laplace`, or after `VAR=value` assignments), comments and line joins removed."""
    out = []
    for block in code_blocks(path.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            segment: list[str] = []
            for word in [*words, "&&"]:  # `a && b`, `a; b`: each command on its own
                if word not in ("&&", "||", ";", "|"):
                    segment.append(word)
                    continue
                while segment and re.fullmatch(r"[A-Z_]+=.*", segment[0]):
                    segment = segment[1:]
                if segment and (segment[0] == "laplace" or segment[0].endswith("/laplace")):
                    out.append(segment[1:])
                segment = []
    return out


def is_group(cmd: object) -> bool:
    # Typer carries its own copy of click, so duck typing rather than isinstance(click.Group).
    return hasattr(cmd, "commands")


def resolve(args: list[str]) -> tuple[object, list[str], list[str]]:
    """(the leaf command, its path of names, the arguments left for it)."""
    cmd, path, rest = CLI, [], list(args)
    while is_group(cmd) and rest and rest[0] in cmd.commands:
        path.append(rest[0])
        cmd = cmd.commands[rest.pop(0)]
    return cmd, path, rest


def page_cases() -> list[tuple[str, list[str]]]:
    return [(f"{p.relative_to(ROOT)}: laplace {shlex.join(a)}", a) for p in PAGES for a in laplace_commands(p)]


def test_the_readme_shows_commands() -> None:
    cmds = laplace_commands(README)
    assert ["chat"] in cmds  # the set-up line's `.venv/bin/laplace chat`
    assert len(cmds) >= 5


@pytest.mark.parametrize("args", [a for _, a in page_cases()], ids=[i for i, _ in page_cases()])
def test_every_documented_command_parses_and_has_help(args: list[str]) -> None:
    cmd, path, rest = resolve(args)
    assert not is_group(cmd), f"laplace {' '.join(path)} needs a subcommand: {args}"
    assert path, f"no such command: laplace {args[0] if args else ''}"
    cmd.make_context(" ".join(["laplace", *path]), rest)  # raises on an unknown option or a missing argument
    res = CliRunner().invoke(app, [*args, "--help"])
    assert res.exit_code == 0, res.output


def _table_rows(text: str) -> list[str]:
    start = text.index("## Commands")
    rows = [line for line in text[start:].splitlines() if line.startswith("| `laplace ")]
    assert rows, "the README has no commands table"
    return rows


def test_every_command_and_flag_in_the_table_exists() -> None:
    rows = _table_rows(README.read_text(encoding="utf-8"))
    seen = set()
    for row in rows:
        cell = re.match(r"\| `(laplace [^`]*)`", row).group(1).replace("\\|", "|")  # type: ignore[union-attr]
        words = cell.split()[1:]
        cmd = CLI.commands[words[0]]
        seen.add(words[0])
        if is_group(cmd):  # `laplace sessions list | show | ...`: every one exists
            names = [w for w in words[1:] if re.fullmatch(r"[a-z]+", w)]
            assert names and all(n in cmd.commands for n in names), (row, sorted(cmd.commands))
            assert set(names) == set(cmd.commands), f"the table lists {names}, the CLI has {sorted(cmd.commands)}"
            continue
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", cell):
            assert flag in opts, f"{row}: laplace {words[0]} has no {flag}"
        if words[0] == "bench":  # the benchmark names listed are exactly the registry's
            from agent.bench import registry

            listed = re.search(r"\[([a-z0-9 ]+)\]", cell).group(1).split()  # type: ignore[union-attr]
            assert listed == list(registry()), f"the table lists {listed}, `laplace bench --list` has {list(registry())}"
    assert seen == set(CLI.commands), f"commands missing from the table: {set(CLI.commands) - seen}"


def test_the_readme_examples_run_on_the_demo_model() -> None:
    """The cheap examples, in order: the second `ask -c` continues the first one's session."""
    ran = 0
    for args in laplace_commands(README):
        cmd, path, _ = resolve(args)
        if tuple(path) not in CHEAP:
            continue
        if path == ["ask"]:
            args = [*args[:1], "-o", "max_new_tokens", "8", *args[1:]]  # short replies: a test, not a chat
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, (args, res.output)
        ran += 1
    assert ran >= 3


def test_ci_runs_the_readmes_test_command() -> None:
    """`.ci/run` runs exactly the README's test command (pip's -q aside) on a fresh venv."""
    blocks = [b.strip() for b in code_blocks(README.read_text(encoding="utf-8"))]
    (readme_cmd,) = [b for b in blocks if b.endswith(".venv/bin/pytest")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_cmd = [line for line in ci.splitlines() if line.endswith(".venv/bin/pytest")][0].replace("pip install -q ", "pip install ")
    assert ci_cmd == readme_cmd
    assert "rm -rf .venv" in ci  # fresh, as the README promises


LINKED = [*PAGES, ROOT / "recipes" / "README.md", *sorted((ROOT / "recipes").rglob("*/*.md"))]


@pytest.mark.parametrize("page", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_every_relative_link_points_at_a_file(page: Path) -> None:
    """The README links to docs/ pages and recipes; a page moved or renamed breaks the link."""
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
