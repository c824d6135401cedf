"""English text that every machine with Python has: the standard library's docstrings."""

from __future__ import annotations

import importlib
import inspect

MODULES = ("argparse", "collections", "json", "logging", "pathlib", "subprocess", "unittest", "typing", "functools",
           "itertools", "re", "datetime", "asyncio", "email", "http.client", "sqlite3", "textwrap", "shutil", "csv",
           "heapq", "bisect", "dataclasses", "contextlib", "abc", "enum", "statistics", "decimal", "fractions")


def stdlib_text(min_chars: int = 20000) -> str:
    """Module, class and function docstrings of MODULES in a fixed order, joined by blank
    lines, until at least `min_chars` characters (the same text for a given Python)."""
    parts: list[str] = []
    total = 0
    for name in MODULES:
        mod = importlib.import_module(name)
        docs = [inspect.getdoc(mod)] + [inspect.getdoc(obj) for _, obj in sorted(vars(mod).items())
                                         if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name]
        for d in docs:
            if d and len(d) > 200:
                parts.append(d)
                total += len(d) + 2
        if total >= min_chars:
            break
    return "\n\n".join(parts)


def reference_text(min_chars: int = 20000) -> str:
    """The Python language reference's prose as the standard library ships it for help()
    (`pydoc_data.topics`), topics in sorted order, until at least `min_chars` characters."""
    from pydoc_data.topics import topics

    parts: list[str] = []
    for name in sorted(topics):
        parts.append(topics[name].strip())
        if sum(len(p) + 2 for p in parts) >= min_chars:
            break
    return "\n\n".join(parts)


TEXTS = {"reference": reference_text, "docstrings": stdlib_text}
