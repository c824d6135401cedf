"""No import cycles among laplace's own modules, at module level or inside functions.

A cycle works only as long as every module in it happens to import the others' names late
(inside functions, or under TYPE_CHECKING); one moved import then breaks start-up. So every
`import` statement counts, wherever it is, including TYPE_CHECKING blocks.

Covered: the `agent` and `sessions` packages and the default model's recipe
(`recipes/default_model`, outside the wheel).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "sessions", "recipes")
EXCLUDED: tuple[str, ...] = ()


def _excluded(module: str) -> bool:
    return any(module == e or module.startswith(e + ".") for e in EXCLUDED)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not _excluded(name):
                found[name] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `name` imports; `from pkg import sub` counts as importing pkg.sub."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_the_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_covers_the_packages_and_follows_relative_imports():
    graph = import_graph()
    assert "sessions.store_core" in graph["sessions.store"]  # `from .store_core import ...`
    assert "agent.chat.service" in graph and "agent.tui.app" in graph
    assert not any(_excluded(m) for m in graph)


def test_no_import_cycles_outside_recipes():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
