"""agent.train imports only agent.runtime: no sessions, UI or database code."""

from __future__ import annotations

import subprocess
import sys


def test_train_does_not_import_sessions_or_ui() -> None:
    code = (
        "import sys, agent.train.loop, agent.train.__main__, agent.train.dist_muon, agent.train.initial_state\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sessions', 'textual', 'sqlite_utils', 'rich'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
