"""STYLE.md's import rules: the package arrows, read statically from every import statement
(scripts/package_graph.py, the same reading that draws docs/architecture.md), and the ones
that matter at run time, checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.package_graph import external_imports, module_graph, package_of

OURS = {"bench", "chat", "cli", "display", "importers", "probes", "recall", "runtime", "serve", "sessions", "settings", "timings",
        "train", "tui"}
# package -> the packages of ours it may import (docs/architecture.md explains each).
ALLOWED = {
    "cli": OURS,
    "bench": OURS - {"cli"},
    "tui": {"chat", "display"},
    "chat": {"runtime", "sessions", "recall"},
    "serve": {"chat", "runtime"},
    "probes": {"runtime", "recall"},
    "recall": {"runtime"},
    "train": {"runtime"},
    "importers": {"runtime"},
    "runtime": set(),
    "sessions": set(),
    "settings": set(),
    "display": set(),
    "timings": set(),
}
# agent/timings.py is a stdlib-only leaf that any layer may record phases into (LAPLACE_TIMINGS).
ALLOWED = {package: allowed | ({"timings"} if package not in ("sessions", "timings") else set())
           for package, allowed in ALLOWED.items()}
GRAPH = module_graph()


def imports_of(package: str) -> dict[str, set[str]]:
    """Module of `package` -> the modules of ours it imports."""
    return {m: t for m, t in GRAPH.items() if package_of(m) == package}


def test_every_package_has_a_rule():
    assert {package_of(m) for m in GRAPH} - {None} == OURS == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_the_layering_allows(package):
    bad = {f"{m} -> {t}" for m, ts in imports_of(package).items() for t in ts
           if package_of(t) not in ALLOWED[package] | {package, None}}
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}: {sorted(bad)}"


def test_chat_never_imports_probes_and_recall_neither_chat_nor_probes():
    for package, banned in (("chat", {"probes"}), ("recall", {"chat", "probes", "sessions", "tui", "cli"})):
        assert not {t for ts in imports_of(package).values() for t in ts if package_of(t) in banned}


def test_tui_imports_only_chat_s_types():
    assert {t for ts in imports_of("tui").values() for t in ts if package_of(t) == "chat"} == {"agent.chat.types"}


def test_sessions_imports_only_the_standard_library_and_sqlite_utils():
    third_party = {top for m, tops in external_imports().items() if package_of(m) == "sessions" for top in tops
                   if top not in sys.stdlib_module_names}
    assert third_party == {"sqlite_utils"}


def test_runtime_never_imports_ui_or_sqlite():
    tops = {top for m, ts in external_imports().items() if package_of(m) == "runtime" for top in ts}
    assert not tops & {"textual", "rich", "sqlite3", "sqlite_utils", "typer"}


def imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_runtime_imports_neither_ui_nor_sqlite():
    mods = imported_after("agent.runtime.generation, agent.runtime.checkpoint, agent.runtime.compiled, agent.runtime.info")
    assert "torch" in mods
    assert not {m for m in mods if m.split(".")[0] in {"textual", "sqlite_utils", "sqlite3", "sessions"}}


@pytest.mark.parametrize("module", ["sessions", "agent.chat.types", "agent.settings", "agent.display", "agent.recall.rule",
                                    "agent.recall.verdicts", "agent.recall.options", "agent.chat.recall", "agent.chat.verify"])
def test_persistence_and_shared_types_never_import_torch(module):
    mods = imported_after(module)
    assert "torch" not in mods


def test_cli_import_is_light():
    """`laplace --help` and `laplace sessions list` must not pay torch's import time."""
    assert "torch" not in imported_after("agent.cli")


@pytest.mark.parametrize("module", ["agent.train.loop", "agent.train.data", "agent.probes.runner", "agent.probes.suites",
                                    "agent.importers", "agent.importers.hub", "agent.importers.selfcheck", "agent.runtime.quant",
                                    "agent.recall.horizon"])
def test_train_and_probes_import_the_runtime_only(module):
    mods = imported_after(module)
    assert not {m for m in mods if m.split(".")[0] in {"textual", "sqlite_utils", "sessions"}}
    assert "agent.chat.service" not in mods and "agent.tui" not in mods


def test_serve_reaches_the_store_only_through_chat_and_never_the_tui():
    mods = imported_after("agent.serve.app, agent.serve.scheduler")
    assert not {m for m in mods if m.split(".")[0] in {"textual"} or m.startswith("agent.tui")}
    assert "torch" not in imported_after("agent.serve.protocol")  # request parsing stays light


def test_tui_never_imports_torch_or_the_store():
    mods = imported_after("agent.tui.factory")
    assert not {m for m in mods if m.split(".")[0] in {"torch", "sqlite_utils", "sessions"}}
    assert not any(m.startswith("agent.runtime") or m == "agent.chat.service" for m in mods)
