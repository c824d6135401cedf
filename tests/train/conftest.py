"""Small corpora written on the fly; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEXT = "The heron stands in the shallow river and waits for fish. " * 40


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text(TEXT, encoding="utf-8")
    (d / "b.md").write_text("# Herons\n\n" + TEXT[::-1], encoding="utf-8")
    (d / "notes.bin").write_bytes(b"\x00\x01")  # ignored: not a data extension
    return d


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    p = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"what is {i}+{i}?"}, {"role": "assistant", "content": f"{2 * i}"}]} for i in range(30)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return p
