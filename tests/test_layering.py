"""STYLE.md's import rules, checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest


def imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_runtime_imports_neither_ui_nor_sqlite():
    mods = imported_after("agent.runtime.generation, agent.runtime.checkpoint, agent.runtime.compiled, agent.runtime.info")
    assert "torch" in mods
    assert not {m for m in mods if m.split(".")[0] in {"textual", "sqlite_utils", "sqlite3", "sessions"}}


@pytest.mark.parametrize("module", ["sessions", "agent.chat.types", "agent.settings", "agent.recall.rule", "agent.recall.verdicts", "agent.chat.recall"])
def test_persistence_and_shared_types_never_import_torch(module):
    mods = imported_after(module)
    assert "torch" not in mods


def test_cli_import_is_light():
    """`laplace --help` and `laplace sessions list` must not pay torch's import time."""
    assert "torch" not in imported_after("agent.cli")


@pytest.mark.parametrize("module", ["agent.train.loop", "agent.train.data", "agent.probes.runner", "agent.probes.suites",
                                    "agent.importers", "agent.importers.hub", "agent.importers.selfcheck", "agent.runtime.quant"])
def test_train_and_probes_import_the_runtime_only(module):
    mods = imported_after(module)
    assert not {m for m in mods if m.split(".")[0] in {"textual", "sqlite_utils", "sessions"}}
    assert "agent.chat.service" not in mods and "agent.tui" not in mods


def test_tui_never_imports_torch_or_the_store():
    mods = imported_after("agent.tui.factory")
    assert not {m for m in mods if m.split(".")[0] in {"torch", "sqlite_utils", "sessions"}}
    assert not any(m.startswith("agent.runtime") or m == "agent.chat.service" for m in mods)
