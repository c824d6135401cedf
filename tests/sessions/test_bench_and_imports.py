"""The store benchmark runs and reports flat resume time; `sessions` stays free of torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sessions
from agent.bench.store import STATE_BYTES_3B, run_store_bench


def test_store_bench_quick(tmp_path: Path) -> None:
    res = run_store_bench(tmp_path, quick=True)
    assert res["state_bytes_3b"] == STATE_BYTES_3B == 29_491_200
    assert res["commit_ms_3b_state"] > res["commit_ms_small_state"] > 0
    assert res["resume_turns_long"] == 1_000
    # generous bound for noisy CI; measured ~1.0 (see the report)
    assert res["resume_ratio_long_over_short"] < 3


def test_sessions_imports_only_stdlib_and_sqlite_utils() -> None:
    allowed = set(sys.stdlib_module_names) | {"sqlite_utils", "sessions"}
    for path in Path(sessions.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
    code = "import sys, sessions, agent.bench.store; sys.exit(int('torch' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
