"""Pure pieces of the TUI: status wording, code-block extraction, keymap validation, and
the import rule (the TUI never pulls in torch, the session store or the runtime)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.chat.types import StatusView, TurnView
from agent.tui import known_binding_ids
from agent.tui.chat.messages import code_blocks, header_text, is_unread
from agent.tui.keymap import validate_keymap
from agent.tui.status import format_status


def test_status_line_has_every_number() -> None:
    view = StatusView(model="laplace-3b", device="cuda", session_uid="abcdef123", session_name="notes",
                      tokens_folded=1_234_567, state_bytes=29_500_000, kv_cache_bytes=364_000_000_000,
                      last_tokens_per_s=41.25)
    line = format_status(view, activity="generating…")
    for part in ["laplace-3b", "cuda", "notes", "1,234,567 tokens folded", "state 29.5 MB",
                 "KV cache would be 364.0 GB", "41.2 tok/s", "generating…"]:
        assert part in line
    assert "tok/s" not in format_status(StatusView("m", "cpu", None, "", 0, 0, 0))
    assert format_status(None) == "no session"


def test_code_blocks_in_order_and_unclosed_tail() -> None:
    text = "a\n```python\nx = 1\n```\nb\n~~~\ny\n~~~\n```sh\nhalf"
    assert code_blocks(text) == ["x = 1\n", "y\n", "half"]
    assert code_blocks("no code") == []


def test_header_shows_branch_and_status() -> None:
    assert "2/3" in header_text("assistant", "complete", 1, 3).plain
    assert "[cancelled]" in header_text("assistant", "cancelled").plain
    assert "/" not in header_text("user", "complete").plain
    assert "not read into the state" in header_text("document", "cancelled", unread=True).plain


def test_a_stopped_turn_without_token_ids_reads_as_unread():
    assert is_unread(TurnView(1, "document", "a long text", "cancelled", n_tokens=0))
    assert not is_unread(TurnView(2, "assistant", "partial", "cancelled", n_tokens=9))
    assert not is_unread(TurnView(3, "assistant", "", "cancelled", n_tokens=0))


def test_keymap_validation() -> None:
    known = known_binding_ids()
    assert {"submit", "newline", "cancel", "regenerate", "sessions", "copy_code"} <= set(known)
    assert validate_keymap({"regenerate": "f5", "newline": ["ctrl+j", " alt+enter"]}, known) == {
        "regenerate": "f5", "newline": "ctrl+j,alt+enter"}
    assert validate_keymap(None, known) == {}
    with pytest.raises(ValueError, match="unknown key binding id 'regen'"):
        validate_keymap({"regen": "f5"}, known)
    with pytest.raises(ValueError, match="must be a key string"):
        validate_keymap({"regenerate": 5}, known)


def test_tui_imports_no_runtime_torch_or_store() -> None:
    code = ("import sys, agent.tui, agent.tui.factory; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'sqlite_utils', 'sessions') "
            "or m.startswith('agent.runtime') or m == 'agent.chat.service']; print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)
