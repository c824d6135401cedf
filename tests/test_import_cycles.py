"""No import cycles among laplace's own modules, at module level or inside functions.

A cycle works only as long as every module in it happens to import the others' names late
(inside functions, or under TYPE_CHECKING); one moved import then breaks start-up. So every
`import` statement counts, wherever it is, including TYPE_CHECKING blocks.

Covered: the `agent` and `sessions` packages and the recipes (`recipes/`, outside the
wheel), read by scripts/package_graph.py.
"""

from __future__ import annotations

from scripts.package_graph import module_graph

PACKAGES = ("agent", "sessions", "recipes")


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
    """Every import statement of the packages (scripts/package_graph.py reads them the same way)."""
    return module_graph(PACKAGES)


def test_the_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_covers_the_packages_and_follows_relative_imports():
    graph = import_graph()
    assert "sessions.store_core" in graph["sessions.store"]  # `from .store_core import ...`
    assert "agent.chat.service" in graph and "agent.tui.app" in graph and "recipes.demo_model.plan" in graph


def test_no_import_cycles_outside_recipes():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
