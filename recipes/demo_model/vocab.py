"""Word lists and phrasings for the synthetic dialogues, in two disjoint worlds.

`TRAIN` builds the training dialogues; `HELDOUT` builds the evaluation dialogues. They
share only the answer shapes the model must produce ("The code for the X is V.", "Your
sister's name is V.", "You haven't told me ...") and differ in every key word, name,
statement phrasing and question phrasing, so an evaluation score is recall of a new
fact in a new wording, not a memorized template. Neither world uses the probe suite's
adjective/noun key lists (agent/probes/text.py), so `laplace probe run` keys are unseen too.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterable


def _w(s: str) -> tuple[str, ...]:
    return tuple(s.split())


@dataclass(frozen=True)
class World:
    name: str
    thing_adj: tuple[str, ...]
    thing_noun: tuple[str, ...]
    code_attrs: tuple[str, ...]  # "code", "pin", ...: "the {attr} for the {thing}"
    people: tuple[str, ...]
    # (slot phrase, value kind): "my {slot}" / "your {slot}"
    slots: tuple[tuple[str, str], ...]
    code_statements: tuple[str, ...]  # {attr} {thing} {value}
    slot_statements: tuple[str, ...]  # {slot} {value}
    code_questions: tuple[str, ...]  # {attr} {thing}
    slot_questions: tuple[str, ...]  # {slot}
    update_code: tuple[str, ...]
    update_slot: tuple[str, ...]
    acks: tuple[str, ...]
    update_acks: tuple[str, ...]
    places: tuple[str, ...]
    foods: tuple[str, ...]
    colors: tuple[str, ...]
    months: tuple[str, ...]


TRAIN = World(
    name="train",
    thing_adj=_w("red blue green black white brown yellow orange pink grey small big old new front back side main upper lower "
                 "north south east west spare office garage kitchen basement attic guest studio lab"),
    thing_noun=_w("door fridge safe bike car van box printer laptop server router cabinet mailbox scooter storage alarm "
                  "phone tablet account wallet suitcase padlock shed freezer boat trailer desk office room"),
    code_attrs=("code", "pin", "number", "password", "combination", "access code"),
    people=_w("Alice Ben Clara David Emma Frank Grace Henry Irene Jack Laura Mark Nora Oscar Paula Ryan Sara Tom Uma Victor "
              "Wendy Yusuf Zoe Leo Mia Noah Eva Liam Ava Ethan Lily Max Ruby Sam Tara Owen Iris Kai Nina Pete"),
    slots=(("sister's name", "person"), ("brother's name", "person"), ("dog's name", "person"), ("cat's name", "person"),
           ("boss's name", "person"), ("doctor's name", "person"), ("best friend's name", "person"),
           ("favorite color", "color"), ("favorite food", "food"), ("home town", "place"), ("room number", "num3"),
           ("locker number", "num3"), ("flight number", "flight"), ("birthday", "date"), ("dentist appointment", "date"),
           ("zip code", "num5"), ("phone extension", "num4"), ("wifi password", "word"), ("car's color", "color"),
           ("train platform", "num2"), ("hotel", "place"), ("order number", "num5"), ("badge number", "num5"),
           ("project name", "word"), ("lucky number", "num2")),
    code_statements=("The {attr} for the {thing} is {value}.", "By the way, the {attr} for the {thing} is {value}.",
                     "Please remember that the {attr} for the {thing} is {value}.", "Note: the {attr} for the {thing} is {value}.",
                     "Just so you know, the {attr} for the {thing} is {value}.", "Remember this: the {attr} for the {thing} is {value}."),
    slot_statements=("My {slot} is {value}.", "By the way, my {slot} is {value}.", "Please remember that my {slot} is {value}.",
                     "Just so you know, my {slot} is {value}.", "Oh, and my {slot} is {value}."),
    code_questions=("What is the {attr} for the {thing}?", "Do you remember the {attr} for the {thing}?",
                    "What was the {attr} for the {thing}?", "Tell me the {attr} for the {thing}."),
    slot_questions=("What is my {slot}?", "Do you remember my {slot}?", "What was my {slot} again?", "Tell me my {slot}."),
    update_code=("Update: the {attr} for the {thing} is now {value}.", "Actually, the {attr} for the {thing} changed to {value}."),
    update_slot=("Update: my {slot} is now {value}.", "Actually, my {slot} changed to {value}."),
    acks=("Noted.", "Got it.", "Okay, I will remember that.", "Noted, thanks."),
    update_acks=("Got it, I updated it.", "Noted, I will use the new one."),
    places=_w("Boston Denver Austin Oslo Lisbon Dublin Madrid Prague Vienna Zurich Seattle Chicago Toronto Sydney Milan Porto"),
    foods=("pasta", "sushi", "tacos", "curry", "pizza", "soup", "salad", "pancakes", "rice", "noodles"),
    colors=_w("red blue green yellow purple orange black white teal pink"),
    months=_w("January February March April May June July August September October November December"),
)

HELDOUT = World(
    name="heldout",
    thing_adj=_w("rear cellar porch loft workshop harbor pantry corner hallway roof"),
    thing_noun=_w("closet terminal kiosk scanner toolbox hangar bin console greenhouse pod"),
    code_attrs=("code", "pin", "key number"),
    people=_w("Greta Hugo Ines Jonas Katya Lars Marta Nico Olga Pavel Rhea Stefan Thea Ulf Vera Willa"),
    slots=(("uncle's name", "person"), ("neighbor's name", "person"), ("parrot's name", "person"), ("favorite fruit", "fruit"),
           ("gate number", "num2"), ("seat number", "num3"), ("membership number", "num5"), ("anniversary", "date"),
           ("favorite city", "place"), ("desk number", "num3")),
    code_statements=("For the record, the {attr} for the {thing} is {value}.", "Keep in mind the {attr} for the {thing} is {value}.",
                     "I set the {attr} for the {thing} to {value}."),
    slot_statements=("For the record, my {slot} is {value}.", "Keep in mind my {slot} is {value}.", "I should mention my {slot} is {value}."),
    code_questions=("Which {attr} did I give you for the {thing}?", "Can you recall the {attr} for the {thing}?"),
    slot_questions=("Which {slot} did I mention?", "Can you recall my {slot}?"),
    update_code=("Correction: the {attr} for the {thing} is {value} from now on.",),
    update_slot=("Correction: my {slot} is {value} from now on.",),
    acks=("Okay.", "Understood."),
    update_acks=("Understood, corrected.",),
    places=_w("Kyoto Bergen Tallinn Ghent Krakow Seville Bordeaux Cork"),
    foods=("plum", "mango", "apricot", "fig", "cherry", "kiwi"),
    colors=_w("navy olive maroon beige"),
    months=_w("January March May July September November"),
)


def widened(world: World, texts: Iterable[str], *, banned: Iterable[str] = (), min_count: int = 3) -> World:
    """`world` with thousands more thing words and a few hundred more slots: every lower-case
    word of 4-9 letters seen at least `min_count` times in `texts` (the training docstrings),
    minus `banned` (the held-out world's and the probe suite's words). A few dozen key words
    can be learned one embedding per key; thousands are meant to push the model to match
    whatever words the user used, as a new fact in a new wording needs. (Measured on the
    shipped model: values are recalled, but a held-out key is often garbled in the reply.)"""
    counts: dict[str, int] = {}
    for text in texts:
        for w in re.findall(r"\b[a-z]{4,9}\b", text):
            counts[w] = counts.get(w, 0) + 1
    drop = {w.lower() for w in banned} | set(world.thing_adj) | set(world.thing_noun)
    pool = sorted(w for w, c in counts.items() if c >= min_count and w not in drop)
    # The user's own details get new slot names too ("my widget number", "my parser's
    # name"), so a slot the model never saw is copied from the question, not guessed.
    kinds = (("number", "num3"), ("number", "num5"), ("name", "person"), ("code", "num4"))
    slots = tuple((f"{w}'s name" if noun == "name" else f"{w} {noun}", kind)
                  for i, w in enumerate(pool[::10]) for noun, kind in [kinds[i % len(kinds)]])
    return dataclasses.replace(world, thing_adj=world.thing_adj + tuple(pool[::2]), thing_noun=world.thing_noun + tuple(pool[1::2]),
                               slots=world.slots + slots)


# More ways to say the same things, for phase 3. Measured on the phase-3 model trained on
# TRAIN's six statement shapes: right after a held-out "I set the pin for the roof scanner
# to 22730." it answered "You haven't told me" 5 times in 6, and after "I should mention
# my anniversary is March 25." it answered with docstring text; facts in the phrasings it
# knew were recalled. None of these is a HELDOUT phrasing (tested).
VARIED = dict(
    code_statements=("Write this down: the {attr} for the {thing} is {value}.", "Here is the {attr} for the {thing}: {value}.",
                     "{value} is the {attr} for the {thing}.", "The {attr} for the {thing}? It is {value}.",
                     "I use {value} as the {attr} for the {thing}.", "Can you store the {attr} for the {thing}? It is {value}.",
                     "FYI the {attr} for the {thing} is {value}.", "Quick note, the {attr} for the {thing} is {value}.",
                     "Don't forget: the {attr} for the {thing} is {value}.", "I made {value} the {attr} for the {thing}.",
                     "We picked {value} as the {attr} for the {thing}.", "Save the {attr} for the {thing}: {value}."),
    slot_statements=("I'd like you to know my {slot} is {value}.", "My {slot}? It is {value}.", "{value} is my {slot}.",
                     "FYI, my {slot} is {value}.", "Save this: my {slot} is {value}.", "Quick note: my {slot} is {value}.",
                     "Here is my {slot}: {value}.", "Don't forget that my {slot} is {value}."),
    code_questions=("What's the {attr} for the {thing}?", "Could you tell me the {attr} for the {thing}?",
                    "Remind me of the {attr} for the {thing}.", "I forgot the {attr} for the {thing}. What is it?",
                    "Any idea what the {attr} for the {thing} is?", "Do you know the {attr} for the {thing}?"),
    slot_questions=("What's my {slot}?", "Could you tell me my {slot}?", "Remind me of my {slot}.", "I forgot my {slot}. What is it?",
                    "Do you know my {slot}?", "Any idea what my {slot} is?"),
    update_code=("Change of plan: the {attr} for the {thing} is {value} now.", "New {attr} for the {thing}: {value}.",
                 "Please replace the {attr} for the {thing} with {value}.", "The {attr} for the {thing} is different now: {value}."),
    update_slot=("Change of plan: my {slot} is {value} now.", "My new {slot} is {value}.", "Please replace my {slot} with {value}.",
                 "My {slot} is different now: {value}."),
    acks=("Sure.", "Okay, noted.", "Thanks, noted.", "All right."),
    update_acks=("Okay, changed.", "Updated.", "Sure, I changed it."),
)


def varied(world: World) -> World:
    """`world` with the VARIED phrasings added to its own."""
    return dataclasses.replace(world, **{k: getattr(world, k) + v for k, v in VARIED.items()})


# Phase 5: phrasings built from openers x cores, so that a fact or question in a wording
# never seen is still read as one. Measured on a model that copies keys well: after a
# held-out statement it refused 10 of 30 stated codes at once (all after "I set ... to
# {value}", a shape no training phrasing had), and after training statements 0 of 30.
# None of these is a HELDOUT phrasing (tested).
_Q_OPEN = ("", "Quick question: ", "Hey, ", "Sorry, ", "One more thing: ", "Hmm, ", "Okay, ", "So, ")
_Q_CODE = ("what is the {attr} for the {thing}?", "what's the {attr} for the {thing} again?",
           "what did I say the {attr} for the {thing} was?", "can you tell me the {attr} for the {thing}?",
           "do you still have the {attr} for the {thing}?", "I need the {attr} for the {thing}.",
           "give me the {attr} for the {thing}, please.", "what {attr} did I use for the {thing}?",
           "what {attr} did I pick for the {thing}?", "for the {thing}, what is the {attr}?",
           "the {attr} for the {thing}, what was it?", "remember the {attr} for the {thing}? What is it?",
           "could you look up the {attr} for the {thing}?", "which {attr} is for the {thing}?",
           "tell me what the {attr} for the {thing} is.", "do you know which {attr} I chose for the {thing}?")
_Q_SLOT = ("what is my {slot}?", "what's my {slot} again?", "what did I say my {slot} was?", "can you tell me my {slot}?",
           "do you still have my {slot}?", "I need my {slot}.", "tell me my {slot}, please.",
           "do you know my {slot}?")
_S_OPEN = ("", "By the way, ", "Heads up: ", "Also, ", "Note that ", "For later, ", "Just so you know, ", "Okay, ")
_S_CODE = ("the {attr} for the {thing} is {value}.", "I changed the {attr} for the {thing} to {value}.",
           "I switched the {attr} for the {thing} to {value}.", "we moved the {attr} for the {thing} to {value}.",
           "the {attr} for the {thing} will be {value}.", "I chose {value} as the {attr} for the {thing}.",
           "the {thing} uses {value} as its {attr}.", "the {attr} I use for the {thing} is {value}.",
           "the {attr} for the {thing} has been {value} since Monday.")
_S_SLOT = ("my {slot} is {value}.", "I changed my {slot} to {value}.", "my {slot} will be {value}.",
           "I'd mention that my {slot} is {value}.", "my {slot} has been {value} for years.")
_U_OPEN = ("", "Heads up, ", "Oh, ", "Sorry, ")
_U_CODE = ("the {attr} for the {thing} is now {value}.", "I changed the {attr} for the {thing} to {value} today.",
           "the {attr} for the {thing} was replaced by {value}.", "from today the {attr} for the {thing} is {value}.",
           "forget the old {attr} for the {thing}, it is {value} now.")
_U_SLOT = ("my {slot} is now {value}.", "I changed my {slot} to {value} today.", "forget my old {slot}, it is {value} now.")


def _compose(openers: tuple[str, ...], cores: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for o in openers:
        for c in cores:
            s = o + c
            out.append(s[0].upper() + s[1:])
    return tuple(out)


COMPOSED = dict(
    code_questions=_compose(_Q_OPEN, _Q_CODE), slot_questions=_compose(_Q_OPEN, _Q_SLOT),
    code_statements=_compose(_S_OPEN, _S_CODE), slot_statements=_compose(_S_OPEN, _S_SLOT),
    update_code=_compose(_U_OPEN, _U_CODE), update_slot=_compose(_U_OPEN, _U_SLOT),
)


def composed(world: World) -> World:
    """`world` with the COMPOSED phrasings added to its own."""
    return dataclasses.replace(world, **{k: getattr(world, k) + v for k, v in COMPOSED.items()})
