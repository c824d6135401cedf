"""docs/architecture.md's diagram and docs/architecture.png are drawn from the code
(scripts/package_graph.py); this fails when they are out of date with it."""

from __future__ import annotations

from scripts.package_graph import DOC, PNG, document, package_graph, png, png_pixels


def test_the_graph_sees_the_arrows_it_should():
    graph = package_graph()
    assert {"recall", "runtime", "sessions"} <= graph["chat"] and graph["recall"] == {"runtime"}
    assert "probes" not in graph["chat"] and graph["sessions"] == set()


def test_the_committed_diagram_matches_the_code():
    graph = package_graph()
    text = DOC.read_text(encoding="utf-8")
    assert document(text, graph) == text, "docs/architecture.md is out of date: run python scripts/package_graph.py"
    assert png_pixels(PNG.read_bytes()) == png_pixels(png(graph)), \
        "docs/architecture.png is out of date: run python scripts/package_graph.py"
