"""Everyday facts as people state them, and the held-out phrasings the natural probe uses.

A `Concept` is one kind of detail a user mentions in passing ("my sister is called Vera",
"I parked on level 4"): the kind of value it holds, the assistant's answer when asked, and
its reply when the detail was never given. Each concept here carries the phrasings that
`laplace probe natural` states and asks it in. Phase 6's training trial
(recipes/experiments/natural.py) trains on the same concepts in *other* phrasings, never
these (a test checks it), so a score here is recall of a detail said in words the model
has not seen said that way.

Every phrasing of a concept, statement or question, shares at least one content word with
the others (its `key`), as people's words do when they come back to a topic; that is what
recall refresh's full-text search can find.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from agent.recall import rule

# Value pools the probe draws from. The recipe's training values come from other pools
# (recipes/experiments/natural.py), so a recalled value is copied, not guessed.
HELDOUT_VALUES: dict[str, tuple[str, ...]] = {
    "person": tuple("Greta Hugo Ines Jonas Katya Lars Marta Nico Olga Pavel Rhea Stefan Thea Ulf Vera Willa".split()),
    "place": tuple("Kyoto Bergen Tallinn Ghent Krakow Seville Bordeaux Cork Tromso Lyon".split()),
    "food": ("plums", "mangoes", "apricots", "figs", "cherries", "kiwis", "walnuts", "sesame"),
    "color": ("navy", "olive", "maroon", "beige", "lilac", "amber"),
    "job": ("beekeeper", "surveyor", "librarian", "welder", "florist", "translator"),
    "month": ("January", "March", "May", "July", "September", "November"),
}


@dataclass(frozen=True)
class Concept:
    """One everyday detail. `answer` and `not_told` are the assistant's replies ({v} is the
    value); `statements`, `questions` and `updates` are the held-out phrasings."""

    name: str
    kind: str  # value kind: "person", "place", "food", "color", "job", "date", "time", "num2".."num5", "word"
    key: str  # the content word every phrasing shares
    answer: str
    not_told: str
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    updates: tuple[str, ...] = ()


def _c(name: str, kind: str, key: str, answer: str, not_told: str, statements: str, questions: str, updates: str = "") -> Concept:
    split = lambda s: tuple(p.strip() for p in s.split("|") if p.strip())  # noqa: E731
    return Concept(name, kind, key, answer, not_told, split(statements), split(questions), split(updates))


CONCEPTS: tuple[Concept, ...] = (
    _c("sister", "person", "sister", "Your sister is called {v}.", "You haven't told me your sister's name.",
       "Oh, my older sister {v} is visiting this weekend. | I was on the phone with my sister {v} for an hour.",
       "Sorry, what did I say my sister's name is? | Who's my sister again?", "My sister goes by {v} these days, not her old name."),
    _c("brother", "person", "brother", "Your brother is called {v}.", "You haven't told me your brother's name.",
       "My little brother {v} just started college. | I'm helping my brother {v} move on Saturday.",
       "What was my brother's name? | Remind me who my brother is?"),
    _c("dog", "person", "dog", "Your dog is called {v}.", "You haven't told me your dog's name.",
       "We just adopted a puppy, and we named the dog {v}. | Sorry, my dog {v} keeps barking at the mailman.",
       "What's my dog called? | Can you remember the name of my dog?"),
    _c("cat", "person", "cat", "Your cat is called {v}.", "You haven't told me your cat's name.",
       "My cat {v} knocked my coffee off the table again. | Our old cat, {v}, sleeps all day.",
       "What's the name of my cat? | My cat, what was its name?"),
    _c("boss", "person", "boss", "Your boss is {v}.", "You haven't told me who your boss is.",
       "My new boss, {v}, wants the report by Friday. | I had lunch with my boss {v} today.",
       "Who is my boss, do you remember? | What's my boss's name?"),
    _c("friend", "person", "friend", "Your best friend is {v}.", "You haven't told me your best friend's name.",
       "I'm meeting my best friend {v} for dinner tonight. | My friend {v} and I go hiking every spring.",
       "Who did I say my best friend was? | What's my best friend called?"),
    _c("hometown", "place", "grew", "You grew up in {v}.", "You haven't told me where you grew up.",
       "I grew up in {v}, near the old harbor. | Funny story, I actually grew up in {v}.",
       "Do you remember where I grew up? | Which city did I grow up in?"),
    _c("moving", "place", "moving", "You are moving to {v}.", "You haven't told me where you are moving.",
       "Big news: we're moving to {v} in the spring. | My company is moving me to {v} next year.",
       "Where am I moving to? | Which city are we moving to?"),
    _c("allergy", "food", "allergic", "You are allergic to {v}.", "You haven't told me about any allergy.",
       "Heads up for recipes: I'm allergic to {v}. | I can't eat {v}, I'm badly allergic.",
       "What am I allergic to again? | Which food did I say I'm allergic to?"),
    _c("favorite_food", "food", "favorite food", "Your favorite food is {v}.", "You haven't told me your favorite food.",
       "Honestly my favorite food in the world is {v}. | If you ask me, {v} is my favorite food.",
       "Do you know my favorite food? | What food is my favorite?"),
    _c("color", "color", "favorite color", "Your favorite color is {v}.", "You haven't told me your favorite color.",
       "I painted my room {v} because it's my favorite color. | {v} has always been my favorite color.",
       "Which color is my favorite? | Remind me of my favorite color?"),
    _c("car", "color", "car", "Your car is {v}.", "You haven't told me what color your car is.",
       "My car is the {v} one parked outside. | I finally bought a car, a {v} hatchback.",
       "What color is my car? | Which car is mine, what color?"),
    _c("job", "job", "work", "You work as a {v}.", "You haven't told me what work you do.",
       "For work, I'm a {v} at a small firm. | I've worked as a {v} for ten years now.",
       "What kind of work do I do? | Remind me what I do for work?"),
    _c("parking", "num2", "parked", "You parked on level {v}.", "You haven't told me where you parked.",
       "I parked the car on level {v} of the garage. | Note to self, I parked on level {v} today.",
       "Where did I park the car? | Which level did I park on?"),
    _c("hotel", "num3", "hotel", "Your hotel room is {v}.", "You haven't told me your hotel room number.",
       "They gave me room {v} at the hotel. | The hotel put us in room {v}, top floor.",
       "What's my room number at the hotel? | Which hotel room am I in?"),
    _c("locker", "num3", "locker", "Your locker is number {v}.", "You haven't told me your locker number.",
       "At the gym I got locker {v}. | My locker this term is number {v}.",
       "Which locker is mine? | What number is my locker?"),
    _c("bus", "num2", "bus", "You take bus {v}.", "You haven't told me which bus you take.",
       "Every morning I catch bus {v} into town. | The bus I take to work is the {v}.",
       "Which bus do I catch? | What's the number of my bus?"),
    _c("apartment", "num3", "apartment", "Your apartment is number {v}.", "You haven't told me your apartment number.",
       "I live in apartment {v}, third floor. | Our apartment number is {v}, if a parcel comes.",
       "What's the number of my apartment? | Which apartment do I live in?"),
    _c("seat", "num2", "seat", "Your seat is number {v}.", "You haven't told me your seat number.",
       "My seat on the train tomorrow is {v}. | I booked seat {v} by the window.",
       "Which seat did I book? | What's my seat number?"),
    _c("order", "num5", "order", "Your order number is {v}.", "You haven't told me your order number.",
       "The shop says my order number is {v}. | My order went out today, number {v}.",
       "What's my order number? | Can you find my order number?"),
    _c("door_code", "num4", "door", "The door code is {v}.", "You haven't told me the door code.",
       "To get in, the door code downstairs is {v}. | The building's door code changed to {v}.",
       "What's the code for the door? | How do I open the door, what's the code?"),
    _c("wifi", "word", "wifi", "The wifi password is {v}.", "You haven't told me the wifi password.",
       "Guests can use the wifi, the password is {v}. | We reset the wifi and the password is {v} now.",
       "What's the wifi password? | How do I get on the wifi?"),
    _c("birthday", "date", "birthday", "Your birthday is on {v}.", "You haven't told me your birthday.",
       "I'm turning thirty on my birthday, {v}. | My birthday falls on {v} this year.",
       "When's my birthday? | Which day is my birthday?"),
    _c("dentist", "date", "dentist", "Your dentist appointment is on {v}.", "You haven't told me about a dentist appointment.",
       "Ugh, I have to see the dentist on {v}. | The dentist moved my appointment to {v}.",
       "When am I seeing the dentist? | What day is my dentist appointment?"),
    _c("meeting", "time", "meeting", "Your meeting is at {v}.", "You haven't told me when your meeting is.",
       "The meeting with the landlord got moved to {v}. | I've got a meeting at {v} I can't miss.",
       "What time is my meeting? | When does my meeting start?"),
    _c("flight", "time", "flight", "Your flight leaves at {v}.", "You haven't told me when your flight leaves.",
       "My flight to see my parents leaves at {v}. | I'm flying out tomorrow, the flight is at {v}.",
       "What time does my flight leave? | When is my flight?"),
)
HELDOUT_CONCEPTS = {c.name: c for c in CONCEPTS}

NOT_TOLD = re.compile(rule.NOT_TOLD.pattern + r"|not told me|don'?t know", re.I)


def make_value(rng: random.Random, kind: str, pools: dict[str, tuple[str, ...]] = HELDOUT_VALUES) -> str:
    """A value of `kind`: names, places and the like from `pools`; numbers, dates, times
    and made-up words drawn fresh."""
    if kind in pools:
        return rng.choice(pools[kind])
    if kind.startswith("num"):
        n = int(kind[3:])
        return str(rng.randint(10 ** (n - 1) + (1 if n == 1 else 0), 10 ** n - 1))
    if kind == "date":
        return f"{rng.choice(pools['month'])} {rng.randint(1, 28)}"
    if kind == "time":
        return f"{rng.randint(1, 12)}:{rng.choice(('00', '15', '30', '45'))}"
    if kind == "word":
        return "".join(rng.choice(("ka", "lo", "mi", "ren", "to", "sa", "vin", "do", "pe", "zu")) for _ in range(3)) + str(rng.randint(10, 99))
    raise ValueError(f"unknown value kind {kind!r}")


def says_not_told(reply: str) -> bool:
    """Whether `reply` says the detail was never given."""
    return bool(NOT_TOLD.search(reply))


def say(phrasing: str, value: str) -> str:
    """A phrasing with its value in place of {v}, its first letter upper case (a value can
    open the sentence: "{v} has always been my favorite color.")."""
    s = phrasing.replace("{v}", value)
    return s[:1].upper() + s[1:]


def mentions(reply: str, value: str) -> bool:
    """Whether `reply` holds `value` as a whole word or number, ignoring case: "Vera" is in
    "your sister is vera.", "12" is not in "level 123"."""
    return re.search(r"(?<![0-9A-Za-z])" + re.escape(value) + r"(?![0-9A-Za-z])", reply, re.I) is not None
