"""Every command-line module's --help prints and exits 0: argparse formats help strings with
%, so a stray "%" (from an f-string's :.0%, say) crashes --help while the options still parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def argparse_modules() -> list[str]:
    found = []
    for top in ("recipes", "agent"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "argparse.ArgumentParser" in path.read_text(encoding="utf-8"):
                mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(mod.removesuffix(".__main__"))
    return found


def test_modules_found() -> None:
    assert "recipes.answer.mix" in argparse_modules()


@pytest.mark.parametrize("module", argparse_modules())
def test_help_prints(module: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout
