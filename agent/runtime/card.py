"""What a model card may record of its model's measured recall, checked without torch: the
shipped settings (`agent.importers.shipped`) write it, the recall horizon
(`agent.recall.horizon`) reads it."""

from __future__ import annotations

MEASURED_KEYS = ("distances", "state", "full_attention", "trials", "how")


def check_measured(m: object) -> dict:
    """A card's `recall_measured`: {"distances": [384, 512, 1024], "state": [28, 30, 25],
    "full_attention": [31, 26, 19], "trials": 32, "how": "the command and its JSON"}: the
    details given back at each distance, refresh off, by the model with its state and by the
    same weights with full attention, in one run. ValueError naming what is wrong."""
    if not isinstance(m, dict) or set(m) != set(MEASURED_KEYS):
        raise ValueError(f"recall_measured must be an object of {', '.join(MEASURED_KEYS)}")
    n, trials = len(m["distances"]) if isinstance(m["distances"], list) else 0, m["trials"]
    if not isinstance(trials, int) or trials < 1 or not n or not isinstance(m["how"], str):
        raise ValueError("recall_measured needs distances, trials >= 1 and how it was measured")
    for key in ("distances", "state", "full_attention"):
        v = m[key]
        if not isinstance(v, list) or len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"recall_measured: {key} must be {n} whole numbers, one per distance")
    if sorted(set(m["distances"])) != m["distances"] or m["distances"][0] < 1:
        raise ValueError("recall_measured: distances must rise from 1 up")
    if not all(0 <= x <= trials for x in m["state"] + m["full_attention"]):
        raise ValueError(f"recall_measured: counts must lie in 0..{trials}")
    return m
