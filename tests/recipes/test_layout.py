"""recipes/ shows what builds what: the SmolLM2 hybrid's corpus, training and measurements
import only downwards, and recipes/README.md has a row for every recipe package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HYBRID = ROOT / "recipes" / "smollm2_hybrid"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_hybrid_recipe_imports_only_downwards() -> None:
    """corpus <- train <- measure: training takes nothing from a measurement script (it once
    took its helpers from one), and the corpus builder knows neither."""
    forbidden = {"corpus": ("recipes.smollm2_hybrid.train", "recipes.smollm2_hybrid.measure"),
                 "train": ("recipes.smollm2_hybrid.measure",)}
    for part, bad in forbidden.items():
        for path in (HYBRID / part).glob("*.py"):
            hits = sorted(m for m in _imports(path) if m.startswith(bad))
            assert not hits, f"{path.relative_to(ROOT)} imports {hits}"


def test_one_perplexity_and_one_relative_mse() -> None:
    """Perplexity is computed in measure/perplexity.py and the branch's error against full
    attention in train/attention.py, nowhere else in the recipe."""
    for path in HYBRID.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name != "perplexity.py":
            assert "cross_entropy" not in text, f"{path.relative_to(ROOT)} computes a perplexity of its own"
        if path.name != "attention.py":
            assert "mse_loss" not in text, f"{path.relative_to(ROOT)} computes a relative MSE of its own"


def test_the_readme_has_a_row_for_every_recipe() -> None:
    readme = (ROOT / "recipes" / "README.md").read_text(encoding="utf-8")
    packages = [p.name for p in (ROOT / "recipes").iterdir() if (p / "__init__.py").is_file()]
    assert packages
    for name in packages:
        assert f"recipes/{name}/" in readme, f"recipes/README.md has no row for recipes/{name}/"
