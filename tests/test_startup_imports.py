"""What `laplace ask` imports before its first token (issue 35: `ask -c` on a 50-turn session
within 1.5 s plus the message's prefill). Each check runs in a fresh interpreter, so it
sees what the command really pulls in, not what earlier tests left in sys.modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Never needed to answer one message: the TUI, the server, training, the probes (a chat's
# /check imports them when asked), the chat-template renderer and the GGUF reader (imports
# of checkpoints), and rich (the sessions commands' tables).
NOT_FOR_ASK = ("textual", "rich", "jinja2", "gguf", "agent.tui", "agent.serve", "agent.train", "agent.probes", "agent.bench",
               "agent.importers.chat_format", "agent.importers.gguf_source")


def _modules(code: str, *args: str, env: dict[str, str] | None = None) -> set[str]:
    full = f"import atexit, sys\natexit.register(lambda: print('\\n'.join(sorted(sys.modules)), file=sys.stderr))\n{code}"
    res = subprocess.run([sys.executable, "-c", full, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert res.returncode == 0, res.stderr[-2000:]
    return set(res.stderr.split())


def _loaded(mods: set[str], names: tuple[str, ...]) -> set[str]:
    return {n for n in names if n in mods or any(m.startswith(n + ".") for m in mods)}


def test_importing_the_cli_loads_no_model_code_and_no_ui():
    mods = _modules("import agent.cli")
    assert not _loaded(mods, NOT_FOR_ASK + ("torch", "tokenizers", "safetensors", "agent.runtime", "agent.importers"))


def test_the_default_models_update_check_does_not_import_the_converters():
    """Every ask on the default model imports `default_model` (for `shipped_changes`)."""
    mods = _modules("import agent.importers.default_model")
    assert not _loaded(mods, ("jinja2", "agent.importers.chat_format", "agent.importers.gguf_source"))


def test_ask_imports_only_what_answering_needs(tmp_path):
    code = "from agent.cli import main\nsys.argv[0] = 'laplace'\nmain()"
    env = {"LAPLACE_HOME": str(tmp_path)}
    _modules(code, "ask", "-m", "tiny", "-o", "max_new_tokens", "2", "hello", env=env)
    mods = _modules(code, "ask", "-c", "-o", "max_new_tokens", "2", "and again", env=env)
    assert "torch" in mods and "agent.chat.service" in mods  # it did answer
    assert not _loaded(mods, NOT_FOR_ASK)
