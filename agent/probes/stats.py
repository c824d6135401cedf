"""Small statistics for probe cells: Wilson intervals, chance correction, D50 / H90, sparklines."""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959964


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a rate; (0, 1) when there are no trials."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def chance_corrected(acc: float, chance: float) -> float:
    """(acc - chance) / (1 - chance): 0 at chance, 1 when always right."""
    if chance >= 1:
        return 0.0
    return (acc - chance) / (1 - chance)


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and a normal 95% interval (the mean twice when n < 2)."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return m, m - half, m + half


def _crossing(distances: Sequence[int], values: Sequence[float], level: float) -> float | None:
    """First distance where `values` falls below `level`, interpolated in log distance."""
    for i in range(1, len(distances)):
        if values[i] < level:
            d0, d1, v0, v1 = distances[i - 1], distances[i], values[i - 1], values[i]
            if v0 == v1 or d0 <= 0:
                return float(d1) if d0 <= 0 else float(d0)
            t = (v0 - level) / (v0 - v1)
            return math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))
    return None


def decay_distances(distances: Sequence[int], cc: Sequence[float], competent: bool) -> dict:
    """D50 and H90 of a row of chance-corrected accuracies (distance 0 first).

    D50: where accuracy above chance halves relative to distance 0. H90: the largest tested
    distance up to which it stays at least 90% of distance 0's. Without competence at
    distance 0 (accuracy not above chance) neither is defined."""
    if not distances or distances[0] != 0 or not competent or cc[0] <= 0:
        return {"d50": None, "h90": None, "d50_censored": False, "why": "no competence at distance 0"}
    d50 = _crossing(distances, cc, 0.5 * cc[0])
    h90 = 0
    for d, v in zip(distances, cc):
        if v < 0.9 * cc[0]:
            break
        h90 = d
    return {
        "d50": round(d50, 1) if d50 is not None else None,
        "h90": h90,
        # Never fell below half: D50 is at least the largest distance tested.
        "d50_censored": d50 is None,
        "why": None,
    }


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None]) -> str:
    """Values in [0, 1] as block characters; a missing value is a space."""
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, max(0, int(round(v * (len(SPARKS) - 1)))))])
    return "".join(out)
