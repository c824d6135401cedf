"""English text from the Python standard library's own docstrings (PSF License 2.0).

A fresh machine that runs laplace has a Python interpreter, and with it the standard
library's source: its module, class and function docstrings are plain technical English
written by people. They are read with `ast` (nothing is imported, so no module runs) from
the interpreter's own `stdlib` directory. Modules are split into train and held-out sets by
a hash of the module name, so the held-out perplexity text never appears in training.

That is only ~180 k tokens of training prose, and the recipe repeats it for millions of
tokens: measured on the phase-2 model, training docstrings scored perplexity 1.3 (learned by
heart) and held-out ones 676. `wide_text` adds prose the recipe's own environment already
holds: the interpreter's `pydoc_data` topics (the language reference, PSF-2.0) and the
docstrings of the pinned torch package (BSD-3-Clause), about four times as much again.
Held-out text stays the held-out stdlib modules only.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__pycache__", "ensurepip"}
HELDOUT_MOD = 10  # one module in ten (by name hash) is held out for perplexity


@dataclass(frozen=True)
class Passage:
    module: str
    name: str  # "module", or the class / function name
    text: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(module: str) -> bool:
    return int(hashlib.sha256(module.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def _clean(doc: str) -> str | None:
    """Keep prose paragraphs; drop doctest, tables, signatures and code-heavy lines."""
    paras = []
    for para in re.split(r"\n\s*\n", doc):
        lines = [ln.strip() for ln in para.strip().splitlines()]
        if not lines or any(ln.startswith((">>>", "...", "|", "+-", "::", "..", "$", "#")) for ln in lines):
            continue
        text = " ".join(lines).replace("``", "")
        letters = sum(ch.isalpha() or ch == " " for ch in text)
        if len(text) < 60 or letters / len(text) < 0.85 or not text[0].isupper() or not text.rstrip().endswith((".", ":")):
            continue
        if not text.isascii():
            continue
        paras.append(text)
    return "\n\n".join(paras) if paras else None


def read_passages(root: Path | None = None) -> list[Passage]:
    """Every usable docstring of every stdlib module, in a stable (sorted) order."""
    root = root or stdlib_dir()
    out: list[Passage] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & SKIP_DIRS or rel.name.startswith("test_"):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes: list[tuple[str, ast.AST]] = [("module", tree)]
        nodes += [(n.name, n) for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and not n.name.startswith("_")]
        for name, node in nodes:
            doc = ast.get_docstring(node)  # type: ignore[arg-type]
            text = _clean(doc) if doc else None
            if text:
                out.append(Passage(module, name, text))
    return out


def pydoc_topics() -> list[Passage]:
    """The language reference's topics that `help()` shows (pydoc_data.topics), as prose
    paragraphs; code and grammar lines are dropped by the same cleaning as docstrings."""
    from pydoc_data.topics import topics  # a plain dict of strings in the stdlib

    out = []
    for name in sorted(topics):
        text = _clean(re.sub(r"\*{3,}|={3,}|-{3,}", "", topics[name]))
        if text:
            out.append(Passage("pydoc_data.topics", name, text))
    return out


def package_dir(name: str) -> Path | None:
    """The installed package's directory, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def wide_text(train: list[Passage]) -> list[Passage]:
    """Training prose: the train stdlib docstrings, the pydoc topics and torch's docstrings
    (module names prefixed "torch."; none of it is held out)."""
    out = list(train) + pydoc_topics()
    torch_dir = package_dir("torch")
    if torch_dir is not None:
        out += [Passage("torch." + p.module, p.name, p.text) for p in read_passages(torch_dir)]
    return out


def split_passages(passages: list[Passage]) -> tuple[list[Passage], list[Passage]]:
    """(train, held out) by module. A held-out docstring whose text a training module also
    has word for word (12 of them: asyncio.sslproto copies asyncio.transports, and so on) is
    dropped, so that no held-out text is ever trained on."""
    train = [p for p in passages if not is_heldout(p.module)]
    seen = {p.text for p in train}
    held = [p for p in passages if is_heldout(p.module) and p.text not in seen]
    return train, held


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 20]
