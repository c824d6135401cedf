"""Seeded small talk: word lists, a tiny grammar and user/assistant exchanges.

The recall horizon of a model whose decays are set by its input (a Mamba-2 mixer) is
measured while it reads `chat_ids` (agent/recall/horizon.py); the probes' `chat` and
`grammar` fillers and their planted keys are made of the same words (agent/probes/text.py,
fillers.py), so the horizon chat uses is measured on what the probes read. Plain Python.
"""

from __future__ import annotations

import random
from typing import Callable

ADJECTIVES = (
    "amber azure bold brisk calm cedar coral crimson dusty eager faint frosty gentle golden "
    "hollow ivory jade keen lunar mellow misty noble olive pale quiet rapid rusty scarlet "
    "silent silver slate solar stone swift tidal umber velvet violet wild woven"
).split()
NOUNS = (
    "anchor badge barrel beacon bridge cabin canal cellar chest compass crate drawer falcon "
    "garden gate harbor hatch island kettle ladder lantern locker meadow mill orchard parcel "
    "pillar portal quarry raven river saddle shelf signal tower trunk valley vault wagon window"
).split()
VERBS = "builds carries checks covers drops finds follows holds keeps leaves lifts moves opens paints reads sees sends turns watches writes".split()
PREPOSITIONS = "near under behind above beside across inside past".split()
DETERMINERS = "the a every one that this".split()
NAMES = "Ada Bruno Chen Dara Emil Faye Gus Hana Ivo Jun Kira Luca Mina Nils Omar Pia Quin Rosa Sami Tove".split()
TOPICS = ("the weather", "a recipe", "the garden", "a trip", "the budget", "a book", "the schedule", "a repair")
def sentence(rng: random.Random) -> str:
    """One sentence from a small grammar: NP VP [PP]."""
    subj = f"{rng.choice(DETERMINERS)} {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    obj = f"{rng.choice(DETERMINERS)} {rng.choice(NOUNS)}"
    s = f"{subj} {rng.choice(VERBS)} {obj}"
    if rng.random() < 0.5:
        s += f" {rng.choice(PREPOSITIONS)} the {rng.choice(NOUNS)}"
    return s[0].upper() + s[1:] + "."


def chat_exchange(rng: random.Random) -> tuple[str, str]:
    """A synthetic (user, assistant) pair of small talk."""
    name = rng.choice(NAMES)
    topic = rng.choice(TOPICS)
    user = f"{name} here. Can you tell me something about {topic}? {sentence(rng)}"
    reply = f"Sure, {name}. About {topic}: {sentence(rng)} {sentence(rng)}"
    return user, reply



def chat_ids(message: Callable[[str, str], list[int]], n: int, rng: random.Random) -> list[int]:
    """Exactly `n` token ids of small talk, each exchange folded as a user and an assistant
    turn by `message(role, text)` (the model's chat template); the last one is cut."""
    ids: list[int] = []
    while len(ids) < n:
        user, reply = chat_exchange(rng)
        ids += message("user", user) + message("assistant", reply)
    return ids[:n]
