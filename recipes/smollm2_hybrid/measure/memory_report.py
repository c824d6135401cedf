"""The memory measurement's reports, read back: the recall horizon of a variant, and one
markdown table (policy x M rows) of any set of `memory.py`'s JSON files, for the model
card and the README."""

from __future__ import annotations

from typing import Any, Sequence

from agent.recall.horizon import horizon_from_card

REFERENCES = {"full": "full attention", "window": "window only"}


def detail_horizon(points: Sequence[tuple[int, float]]) -> int | None:
    """The largest measured distance up to which detail recall stays >= 0.9 (the floor chat
    uses), None when the nearest distance already falls below it. Read the way chat reads a
    card (`horizon_from_card`), so the number means there what it means here; record it as
    the card's `recall_horizon`."""
    card = {"heldout_recall_5digit": " ".join(f"{d}:{acc}" for d, acc in points)}
    return horizon_from_card(card) if points else None


def _length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _cut(name: str) -> str:
    return "ppl < S+W" if name == "within" else f"ppl S+W..{name.removeprefix('past_')}"


def render_table(reports: Sequence[dict[str, Any]]) -> str:
    """One row per variant (the references, then policy x M), one column per passkey
    length, detail distance (recall, and its ratio to full attention's in the same run),
    perplexity band and the horizon. Where files repeat a cell, the first file's is kept."""
    variants: dict[str, dict[str, Any]] = {}
    cells: dict[tuple[str, str], str] = {}
    columns: dict[str, tuple[int, int]] = {}  # header -> (group, sort key)
    notes: list[str] = []
    for rep in reports:
        for v in rep["variants"]:
            variants.setdefault(v["name"], v)
        m, s = rep["model"], rep["settings"]
        what = rep["measure"]
        if what == "passkey":
            notes.append(f"passkey: {s['trials']} trials a length, {s['filler']} filler, seed {rep['seed']}")
            for row in rep["rows"]:
                col = f"passkey {_length(row['length'])}"
                columns[col] = (0, row["length"])
                for name, r in row["variants"].items():
                    cells.setdefault((name, col), f"{r['hits']}/{r['n']}")
        elif what == "detail":
            notes.append(f"detail: {s['trials']} trials a distance, chat filler, recall (ratio to full attention's), seed {rep['seed']}")
            for row in rep["rows"]:
                col = f"detail {row['distance']} ({row['multiple']:g}W)"
                columns[col] = (1, row["distance"])
                for name, r in row["variants"].items():
                    ratio = "" if name == "full" else (f" ({r['ratio_to_full']:.2f}x)" if r["ratio_to_full"] is not None else " (-)")
                    cells.setdefault((name, col), f"{r['score']:.2f}{ratio}")
            columns["horizon"] = (3, 0)
            for name, h in rep["horizon"].items():
                cells.setdefault((name, "horizon"), "-" if h is None else str(h))
        elif what == "ppl":
            diff = max(r["within_max_abs_diff"] for r in rep["rows"][0]["variants"].values())
            notes.append(f"ppl: {len(s['docs'])} documents of {s['tokens']} tokens from {s['source']}; below S+W every "
                         f"variant's losses are full attention's to {diff:.1e}")
            for name, r in rep["rows"][0]["variants"].items():
                for cut, (lo, hi) in s["cuts"].items():
                    col = _cut(cut)
                    columns[col] = (2, hi)
                    cells.setdefault((name, col), f"{r[cut]:.3f}")
        else:
            raise ValueError(f"not a memory measurement: measure {what!r}")
        notes.append(f"model {m['name']} ({m['fingerprint'][:12]}), W={m['window']}, S={m['sinks']}")
    cols = sorted(columns, key=lambda c: columns[c])
    order = sorted(variants, key=lambda n: (n not in REFERENCES, list(REFERENCES).index(n) if n in REFERENCES else 0,
                                            variants[n]["memory_policy"] or "", variants[n]["memory_slots"]))
    lines = ["| variant | M | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for n in order:
        v = variants[n]
        label = REFERENCES.get(n, f"memory, {v['memory_policy']}")
        lines.append(f"| {label} | {v['memory_slots'] or '-'} | " + " | ".join(cells.get((n, c), "") for c in cols) + " |")
    return "\n".join(lines + [""] + [f"- {x}" for x in dict.fromkeys(notes)])
