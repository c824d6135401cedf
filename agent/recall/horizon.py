"""The recall horizon: how many tokens after a detail the state has likely let it fade.

Turns that ended further back than the horizon are the ones recall refresh may read again
(agent/recall/rule.py). The number comes from the model card's measured recall when the card
records one, else from the heads' half-lives. Chat and the probes ask the same function, so
a probe measures refresh at the horizon chat uses. A card's horizon, or a window model's,
needs no torch: only reading the heads' half-lives imports it.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from agent.recall.smalltalk import chat_ids
from agent.runtime.card import check_measured  # torch-free

if TYPE_CHECKING:
    from agent.runtime.checkpoint import LoadedModel

RECALL_FLOOR = 0.9  # a card's measured recall at or above this counts as "still held"
# A card's measured recall of a detail with the state against full attention in the same run
# (`recall_measured`): at or above this share of full attention's, the state still holds it.
RELATIVE_FLOOR = 0.9
MEASURE_TOKENS = 512  # small talk read to measure an input-driven mixer's decays


def horizon_from_measured(m: dict) -> int | None:
    """The largest measured distance up to which the state gives back at least RELATIVE_FLOOR
    of what full attention does at every measured distance (`check_measured`'s form); None
    when it falls short at the first. Past it, the state has lost what full attention keeps,
    and refresh brings it back; before it, refresh would repeat what the state holds."""
    good = None
    for d, state, full in zip(m["distances"], m["state"], m["full_attention"]):
        if state < RELATIVE_FLOOR * full:
            break
        good = d
    return good


def window_horizon(window: int) -> int:
    """A window hybrid's horizon without a measured card: a quarter of its window, so that
    what a recall block and the question push along is still inside the window when the
    answer is written (`recall_horizon`)."""
    return window // 4


def horizon_from_card(card: dict) -> int | None:
    """The recall horizon a model card records: `recall_horizon` if given, else the one its
    measured recall against full attention gives (`recall_measured`, `horizon_from_measured`),
    else the largest measured distance up to which held-out recall of a planted detail stays
    >= 0.9 (`heldout_recall_5digit`, "distance:accuracy ..."). None when the card has none."""
    explicit = card.get("recall_horizon")
    if isinstance(explicit, (int, float)) and explicit > 0:
        return int(explicit)
    if "recall_measured" in card:
        try:
            return horizon_from_measured(check_measured(card["recall_measured"]))
        except (ValueError, TypeError):
            return None  # a card edited by hand: fall back to the model's own rule
    raw = card.get("heldout_recall_5digit")
    if not isinstance(raw, str):
        return None
    points = []
    for item in raw.split():
        d, _, acc = item.partition(":")
        try:
            points.append((int(d), float(acc)))
        except ValueError:
            return None
    good = None
    for d, acc in sorted(points):
        if acc < RECALL_FLOOR:
            break
        good = d
    return good


def model_half_lives(lm: LoadedModel) -> tuple[list[list[float]], str]:
    """Half-life per layer and head, and where it comes from. The Laplace mixer's are read
    off its gates at rest (no tokens needed). A Mamba-2 mixer's decays are set by its input
    (at rest a Llamba head halves every token, which says nothing), so they are measured
    while the model reads 512 tokens of small talk (the probes' chat filler)."""
    import torch

    from agent.recall.decays import capture_decays, half_lives, resting_half_lives, round6

    if lm.config.mixer == "gla":
        return resting_half_lives(lm.model), "gate bias at rest"
    ids = chat_ids(lambda role, text: lm.template.message(lm.tokenizer, role, text), MEASURE_TOKENS, random.Random(0))
    with capture_decays(lm.model) as rec, torch.inference_mode():
        lm.model(torch.tensor([ids], device=lm.model.embed.weight.device))
    _, half = half_lives(rec.take()[:, 0])
    return [[round6(x) for x in row] for row in half.tolist()], "decays measured on 512 tokens of chat filler"


def recall_horizon(lm: LoadedModel) -> tuple[int, str]:
    """Tokens after which a planted detail has likely faded from the state, and where the
    number comes from: the model card's measured recall when it records one
    (`horizon_from_card`), else half the slowest head's half-life from `model_half_lives`
    (that head then still keeps about 70% of a write; measured exact recall of a detail
    fades well before the slowest head does: the demo model's card says 0.85 at 1,024
    tokens where its slowest head's half-life is about 1,500). A window hybrid without a
    measured card reads only its window exactly: a quarter of it, so that what a recall
    block and the question push along is still inside the window when the answer is written
    (the GLA branch's slow decays say nothing of how exactly it recalls)."""
    measured = horizon_from_card(lm.card)
    if measured is not None:
        if "recall_horizon" not in lm.card and "recall_measured" in lm.card:
            how = lm.card["recall_measured"]["how"]
            return measured, f"model card (the state's recall of a detail >= {RELATIVE_FLOOR}x full attention's up to here: {how})"
        return measured, "model card (held-out recall >= 0.9)"
    if lm.config.mixer == "window":
        return window_horizon(lm.config.window), f"a quarter of the {lm.config.window}-token window read exactly"
    half, basis = model_half_lives(lm)
    slowest = max((x for row in half for x in row if math.isfinite(x)), default=0.0)
    return int(slowest / 2), f"half the slowest head's half-life ({basis})"
