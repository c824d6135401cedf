"""Seeded synthetic dialogues: dense recall drills inside ordinary chat.

One dialogue is a list of chat messages (system, user, assistant, document) laid out to
exactly `length` tokens, so that the trainer's packer (stride = sequence length) puts each
dialogue in its own row and no question ever refers to a fact in another row. Inside it:

- facts planted in passing (codes for things, the user's own details), acknowledged,
  sometimes several at once, sometimes inside a message about something else;
- questions about them after a scheduled gap (`gap` tokens, drawn per fact), answered
  verbatim; the latest value after an update; "You haven't told me ..." for a fact that
  was never stated;
- unrelated chat between them: small talk and answers drawn from the standard library's
  docstrings, attached documents with facts inside, a system prompt that names the
  assistant.

Many facts and questions per row keep the recall signal dense; the gap range is the
curriculum knob (short first, longer once short-range recall works), while the number of
questions per token stays about constant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from recipes.demo_model.corpus import Passage, sentences
from recipes.demo_model.vocab import World

Message = dict[str, str]
Counter = Callable[[Message], int]

SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vin", "do", "pe", "ra", "zu", "ne", "bo", "li", "tam", "fe")
SMALL_TALK = (
    ("How are you today?", "I am doing well, thank you. How can I help you today?"),
    ("Thanks for the help.", "You are welcome. Let me know if you need anything else."),
    ("Can you give me a tip for sleeping better?", "Try to go to bed at the same time every night, and keep your room cool and dark."),
    ("What should I cook for dinner?", "A simple pasta with vegetables is quick to make and easy to change to your taste."),
    ("I feel a bit tired.", "That happens. A short walk, a glass of water or a small break can help."),
    ("How do I stay focused while working?", "Work in short blocks, put your phone away, and take a short break between blocks."),
    ("Any advice for a long flight?", "Drink water, stand up and stretch now and then, and bring something to read."),
    ("What is a good way to learn a language?", "Practice a little every day, read simple texts, and speak with other people when you can."),
    ("How do I keep my plants alive?", "Give them light, water them when the soil is dry, and do not let water stand in the pot."),
    ("Should I write tests for my code?", "Yes. Small tests catch mistakes early and make it safer to change the code later."),
    ("What is a list in Python?", "A list is an ordered collection of items. You can add, remove and change items in it."),
    ("What does a dictionary do?", "A dictionary maps keys to values, so you can look up a value by its key quickly."),
    ("How do I read a file in Python?", "Open it with open(), then call read() on the file object, or loop over its lines."),
    ("What is a function?", "A function is a named block of code that takes inputs, does some work and can return a result."),
    ("Why is my program slow?", "Measure first. Find the part that takes the most time, then make that part faster."),
    ("What is version control?", "Version control keeps the history of your files, so you can see changes and go back to older versions."),
    ("Tell me a fun fact.", "Octopuses have three hearts, and their blood is blue."),
    ("What is the weather like?", "I cannot see the weather, but a weather app or a window will tell you."),
    ("Can you help me plan my week?", "Sure. List your tasks, pick the three most important ones, and give each a day."),
    ("What is a good habit to start?", "A short walk every day is easy to start and good for both body and mind."),
    ("How do I make a good cup of tea?", "Use fresh water, let it steep for three to five minutes, and do not let it get too strong."),
    ("I have a meeting soon.", "Good luck with your meeting. Write down the main points you want to make."),
    ("What is an error message?", "An error message tells you what went wrong and often where, so read it from the last line up."),
    ("How do I sort a list?", "Call sorted() on the list to get a new sorted list, or call its sort() method to sort it in place."),
)
HELDOUT_SMALL_TALK = (
    ("Good morning! Anything new?", "Good morning. Nothing new on my side. What would you like to talk about?"),
    ("Do you like music?", "I do not listen to music, but I can talk about it with you."),
    ("How do I start running?", "Start slowly, with short runs and walks mixed together, and add a little more each week."),
    ("What is a loop in programming?", "A loop runs the same block of code many times, once for each item or until a condition is false."),
    ("Can you suggest a weekend activity?", "A walk in a park, a visit to a museum or cooking something new are all good choices."),
    ("What is a variable?", "A variable is a name that refers to a value, so you can use and change the value later."),
)
TOPIC_QUESTIONS = ("Tell me about {thing}.", "What does {thing} do?", "Can you explain {thing}?", "What is {thing}?")
HELDOUT_TOPIC_QUESTIONS = ("Give me a short summary of {thing}.", "I am curious about {thing}. What is it?")


def make_value(rng: random.Random, kind: str, world: World) -> str:
    if kind == "num5":
        return str(rng.randint(10000, 99999))
    if kind == "num4":
        return str(rng.randint(1000, 9999))
    if kind == "num3":
        return str(rng.randint(100, 999))
    if kind == "num2":
        return str(rng.randint(2, 99))
    if kind == "hex":
        return "0x" + "".join(rng.choice("0123456789abcdef") for _ in range(6))
    if kind == "person":
        return rng.choice(world.people)
    if kind == "color":
        return rng.choice(world.colors)
    if kind in ("food", "fruit"):
        return rng.choice(world.foods)
    if kind == "place":
        return rng.choice(world.places)
    if kind == "date":
        return f"{rng.choice(world.months)} {rng.randint(1, 28)}"
    if kind == "flight":
        return f"{rng.choice('ABDKLU')}{rng.choice('AXZY')} {rng.randint(100, 9999)}"
    if kind == "word":
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
    raise ValueError(kind)


def code_value(rng: random.Random, world: World) -> str:
    r = rng.random()
    if r < 0.65:
        return make_value(rng, "num5", world)
    if r < 0.8:
        return make_value(rng, "hex", world)
    if r < 0.9:
        return make_value(rng, "num4", world)
    return f"{rng.choice(world.thing_adj)} {rng.choice(world.thing_noun)}"


@dataclass
class Fact:
    """A fact the user can state: a code for a thing, or one of the user's own details."""

    kind: str  # "code" | "slot"
    attr: str  # code attr or slot phrase
    thing: str  # "" for slots
    value_kind: str
    value: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.attr, self.thing)

    def statement(self, rng: random.Random, world: World, update: bool = False) -> str:
        if self.kind == "code":
            t = rng.choice(world.update_code if update else world.code_statements)
            return t.format(attr=self.attr, thing=self.thing, value=self.value)
        t = rng.choice(world.update_slot if update else world.slot_statements)
        return t.format(slot=self.attr, value=self.value)

    def question(self, rng: random.Random, world: World) -> str:
        if self.kind == "code":
            return rng.choice(world.code_questions).format(attr=self.attr, thing=self.thing)
        return rng.choice(world.slot_questions).format(slot=self.attr)

    def answer(self) -> str:
        if self.kind == "code":
            return f"The {self.attr} for the {self.thing} is {self.value}."
        return f"Your {self.attr} is {self.value}."

    def not_told(self, key_local: bool = False) -> str:
        """The refusal. `key_local` repeats the key first and refuses in its value's place
        ("The pin for the X is something you haven't told me."), so the choice is made
        right after the key is restated, as a recall answer's first digit is."""
        if key_local:
            if self.kind == "code":
                return f"The {self.attr} for the {self.thing} is something you haven't told me."
            return f"Your {self.attr} is something you haven't told me."
        if self.kind == "code":
            return f"You haven't told me the {self.attr} for the {self.thing}."
        return f"You haven't told me your {self.attr}."


def new_fact(rng: random.Random, world: World, taken: set[tuple[str, str]]) -> Fact:
    for _ in range(100):
        if rng.random() < 0.6:
            f = Fact("code", rng.choice(world.code_attrs), f"{rng.choice(world.thing_adj)} {rng.choice(world.thing_noun)}", "code")
        else:
            slot, vk = rng.choice(world.slots)
            f = Fact("slot", slot, "", vk)
        if f.key not in taken:
            f.value = code_value(rng, world) if f.kind == "code" else make_value(rng, f.value_kind, world)
            return f
    raise RuntimeError("no free fact key")


@dataclass
class Live:
    fact: Fact
    due: int  # token position after which the question is asked
    stale: str | None = None
    ghost: bool = False  # a key never stated: the question is answered "You haven't told me"


NEAR_GAP = 24  # tokens: "asked at once" for DialogueSpec.near_gap
KEY_DRILL_SIBLINGS = 0.3  # share of a key drill's codes that are one word off an earlier one


@dataclass
class DialogueSpec:
    """Shape of one dialogue: its exact token length and the gap range of its questions."""

    length: int
    gap_min: int
    gap_max: int
    max_live: int = 6
    doc_prob: float = 0.08
    plant_prob: float = 0.40  # chance per free slot of planting new facts
    filler_words: int = 60  # longest docstring answer in the unrelated chat
    small_talk: float = 0.4  # share of unrelated exchanges that are small talk (short)
    name_prob: float = 0.0  # chance of "What is your name?" (answered from the system prompt)
    never_prob: float = 0.10  # chance of a question about a fact never stated
    near_miss: float = 0.0  # share of never-stated questions about a thing one word off a stated one
    update_prob: float = 0.08  # chance per free slot of changing a live fact's value
    # Draw each dialogue's cap on live facts from 1..max_live (and chat instead of planting
    # when it is full), so that questions also come when one or two facts are known: a
    # never-stated question then cannot be answered by "the only value I hold".
    vary_live: bool = False
    # Chance, per planted fact, of also scheduling a question about a key that is never
    # stated (one word off the planted key with chance `near_miss`), due after a gap drawn
    # like the fact's own. `never_prob` questions come in free slots, so they are rare
    # right after a statement and at the distances where stated facts are asked; a model
    # then learns "a question soon after a fact is about a new key" and "a question long
    # after is about an old one" instead of checking the key (measured: it refused 0.92 of
    # stated facts asked at once, and at 256 tokens answered never-stated questions with
    # invented values 0.83 of the time). Ghosts put both kinds at the same moments.
    ghost_prob: float = 0.0
    # Chance that a planted fact (and its ghost) is first asked within NEAR_GAP tokens: with
    # gaps drawn evenly from 0..450, a question right after the statement is rare, and a
    # model left without that case refused 0.79 of stated facts asked at once.
    near_gap: float = 0.0
    # Rows of the key drill (`Builder.key_drill`) instead of ordinary chat.
    key_drill: bool = False
    # Refusals in the key-local form (`Fact.not_told`).
    key_local: bool = False
    # Key drill only: how many never-stated questions a block asks (drawn evenly), the
    # chance that one is about an unrelated key rather than a stated key with one word
    # changed, and the chance that a block updates one of its codes before the questions.
    drill_ghosts: tuple[int, int] = (0, 2)
    far_ghosts: float = 0.0
    drill_updates: float = 0.0
    # Key drill only: the share of a block's facts (and of its unrelated never-stated
    # questions) that are the user's own details ("my desk number") instead of codes.
    drill_slots: float = 0.0


@dataclass
class Builder:
    """Builds dialogues for one world from a seeded rng; `count` gives a message's tokens."""

    world: World
    passages: list[Passage]
    count: Counter
    pad_words: tuple[str, ...] = ()  # single-token words used to hit the exact length
    heldout: bool = False
    stats: dict[str, int] = field(default_factory=dict)

    def _bump(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    # ---- unrelated chat ---------------------------------------------------------------

    def passage_reply(self, rng: random.Random, max_words: int = 60) -> tuple[str, str]:
        p = rng.choice(self.passages)
        subject = f"the {p.module} module" if p.name == "module" else f"{p.name} in {p.module}"
        sents = sentences(p.text) or [p.text]
        out: list[str] = []
        for s in sents:
            if out and len(" ".join(out + [s]).split()) > max_words:
                break
            out.append(s)
        reply = " ".join(out)
        words = reply.split()
        if len(words) > max_words:
            reply = " ".join(words[:max_words]).rstrip(",;:") + "."
        return subject, reply

    def filler(self, rng: random.Random, spec: DialogueSpec | None = None) -> list[Message]:
        talk = HELDOUT_SMALL_TALK if self.heldout else SMALL_TALK
        topics = HELDOUT_TOPIC_QUESTIONS if self.heldout else TOPIC_QUESTIONS
        if rng.random() < (spec.small_talk if spec else 0.4):
            u, a = rng.choice(talk)
            return [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        subject, reply = self.passage_reply(rng, spec.filler_words if spec else 60)
        return [{"role": "user", "content": rng.choice(topics).format(thing=subject)}, {"role": "assistant", "content": reply}]

    def document(self, rng: random.Random, facts: list[Fact]) -> Message:
        p = rng.choice(self.passages)
        sents = sentences(p.text)[:6] or [p.text]
        for f in facts:
            sents.insert(rng.randrange(len(sents) + 1), f.statement(rng, self.world))
        name = f"{p.module.replace('.', '_')}_{rng.randint(1, 99)}.txt"
        return {"role": "document", "content": f"{name}\n\n" + " ".join(sents)}

    def system(self, rng: random.Random) -> tuple[Message, str | None]:
        r = rng.random()
        if r < 0.3:
            return {"role": "system", "content": ""}, None
        if r < 0.6:
            return {"role": "system", "content": "You are a helpful assistant."}, None
        name = rng.choice(self.world.people)
        return {"role": "system", "content": f"You are {name}, a friendly assistant."}, name

    # ---- the dialogue -----------------------------------------------------------------

    def dialogue(self, rng: random.Random, spec: DialogueSpec) -> list[Message]:
        if spec.key_drill:
            return self.key_drill(rng, spec)
        w = self.world
        sys_msg, own_name = self.system(rng)
        msgs: list[Message] = [sys_msg]
        pos = self.count(sys_msg) + 1  # + BOS
        live: list[Live] = []
        taken: set[tuple[str, str]] = set()
        asked_name = False
        cap = rng.randint(1, spec.max_live) if spec.vary_live else spec.max_live

        # Room for the shortest closing message ("Okay"): 4 tokens with the trained BPE, more
        # with a byte-level tokenizer.
        reserve = self.count({"role": "user", "content": "Okay"})

        def fits(new: list[Message]) -> bool:
            return pos + sum(self.count(m) for m in new) <= spec.length - reserve

        def near_key(f: Fact) -> Fact | None:
            """A code key one word off `f` (same attr and adjective, other noun) that is not
            taken; None after 20 tries."""
            adj = f.thing.split()[0]
            for _ in range(20):
                cand = Fact("code", f.attr, f"{adj} {rng.choice(w.thing_noun)}", "code")
                if cand.key not in taken:
                    return cand
            return None

        def ghost_of(f: Fact) -> Fact:
            """A key never stated: near `f` or anywhere."""
            near = near_key(f) if f.kind == "code" and rng.random() < spec.near_miss else None
            return near or new_fact(rng, w, taken)

        def gap() -> int:
            if spec.near_gap and rng.random() < spec.near_gap:  # (no draw when off)
                return rng.randint(0, min(NEAR_GAP, spec.gap_max))
            return rng.randint(spec.gap_min, spec.gap_max)

        def held() -> list[Live]:
            return [lv for lv in live if not lv.ghost]

        for _ in range(400):
            due = [lv for lv in live if lv.due <= pos]
            r = rng.random()
            kind = "filler"
            if due:
                kind = "ask"
            elif r < spec.plant_prob and len(held()) < cap:
                kind = "plant"
            elif r < spec.plant_prob and spec.vary_live:
                kind = "filler"
            elif r < spec.plant_prob + spec.never_prob:
                kind = "never"
            elif r < spec.plant_prob + spec.never_prob + spec.update_prob and held():
                kind = "update"
            elif r < spec.plant_prob + spec.never_prob + spec.update_prob + spec.doc_prob and len(held()) < cap:
                kind = "doc"
            elif r < spec.plant_prob + spec.never_prob + spec.update_prob + spec.doc_prob + spec.name_prob and not asked_name:
                kind = "name"
            new: list[Message]
            if kind == "ask":
                lv = due[0]
                reply = lv.fact.not_told(spec.key_local) if lv.ghost else lv.fact.answer()
                new = [{"role": "user", "content": lv.fact.question(rng, w)}, {"role": "assistant", "content": reply}]
            elif kind == "plant":
                n = 1 if rng.random() < 0.7 else rng.randint(2, 3)
                facts = []
                for _ in range(min(n, cap - len(held()))):
                    f = new_fact(rng, w, taken)
                    taken.add(f.key)
                    facts.append(f)
                body = " ".join(f.statement(rng, w) for f in facts)
                if rng.random() < 0.3:  # in passing, inside a message about something else
                    extra = self.filler(rng, spec)
                    new = [{"role": "user", "content": body + " " + extra[0]["content"]}, extra[1]]
                else:
                    new = [{"role": "user", "content": body}, {"role": "assistant", "content": rng.choice(w.acks)}]
            elif kind == "doc":
                facts = []
                for _ in range(rng.randint(1, 2)):
                    f = new_fact(rng, w, taken)
                    f.kind, f.value_kind = "code", "code"
                    f.attr = rng.choice(w.code_attrs)
                    f.thing = f"{rng.choice(w.thing_adj)} {rng.choice(w.thing_noun)}"
                    f.value = code_value(rng, w)
                    if f.key in taken:
                        continue
                    taken.add(f.key)
                    facts.append(f)
                new = [self.document(rng, facts)]
            elif kind == "never":
                f = new_fact(rng, w, taken)
                codes = [lv.fact for lv in held() if lv.fact.kind == "code"]
                if codes and rng.random() < spec.near_miss:
                    f = near_key(rng.choice(codes)) or f
                new = [{"role": "user", "content": f.question(rng, w)}, {"role": "assistant", "content": f.not_told(spec.key_local)}]
            elif kind == "update":
                lv = rng.choice(held())
                old = lv.fact.value
                while lv.fact.value == old:
                    lv.fact.value = code_value(rng, w) if lv.fact.kind == "code" else make_value(rng, lv.fact.value_kind, w)
                new = [{"role": "user", "content": lv.fact.statement(rng, w, update=True)},
                       {"role": "assistant", "content": rng.choice(w.update_acks)}]
            elif kind == "name":
                reply = f"My name is {own_name}." if own_name else "My name is Laplace."
                new = [{"role": "user", "content": rng.choice(("What is your name?", "Who are you?"))},
                       {"role": "assistant", "content": reply}]
            else:
                new = self.filler(rng, spec)
            if not fits(new):
                if kind == "ask":
                    break
                new = self.filler(rng, spec)
                if not fits(new):
                    break
            # bookkeeping only for what is actually added
            if kind == "ask":
                live.remove(due[0])
                self._bump("never" if due[0].ghost else "questions")
                if rng.random() < 0.25:  # asked again later: the same key at a longer gap
                    live.append(Live(due[0].fact, pos + rng.randint(spec.gap_min, spec.gap_max), ghost=due[0].ghost))
            elif kind in ("plant", "doc"):
                for f in facts:
                    live.append(Live(f, pos + gap()))
                    if spec.ghost_prob and rng.random() < spec.ghost_prob:  # (no draw when off: old seeds keep their data)
                        g = ghost_of(f)
                        taken.add(g.key)  # never planted later in this dialogue
                        live.append(Live(g, pos + gap(), ghost=True))
                self._bump("facts", len(facts))
            elif kind == "never":
                self._bump("never")
            elif kind == "update":
                self._bump("updates")
                lv.due = max(lv.due, pos + rng.randint(spec.gap_min // 2, spec.gap_max // 2))
            elif kind == "name":
                asked_name = True
            msgs += new
            pos += sum(self.count(m) for m in new)
        msgs.append(self.pad(rng, spec.length - pos))
        return msgs

    def key_drill(self, rng: random.Random, spec: DialogueSpec) -> list[Message]:
        """A row of key drills: 2-4 codes for things stated (one to three per message), then
        every one asked in shuffled order, with up to two questions about a stated key with
        one word changed ("You haven't told me ..."); again until the row is full.

        Measured on the phase-3 model: with two codes held it gave the right one 0.40-0.44
        of the time over 0-512 tokens (the other code 0.37-0.42; 96 trials), i.e. it
        answered with "a recent code", not the one asked for. Here only the key tells the
        answers apart: most values are 5-digit, and 30% of the codes share two of their
        three words with an earlier one. (Keys are unique within a block, not within the row: a later block
        may restate an earlier key with a new value, which its answers then give, and a
        later block's ghost may be a key an earlier block stated: none of 846 checked was.)

        Phase 5's drills set `spec.drill_ghosts` (1-3 never-stated questions a block),
        `spec.far_ghosts` (those keys unrelated to any stated one instead of one word off),
        `spec.drill_updates` (a block restates one fact with a new value before the
        questions, which then get the new value), `spec.drill_slots` (a share of the facts
        and never-stated questions are the user's own details) and `spec.key_local`
        (refusals restate the key). The defaults draw from `rng` exactly as before, so
        earlier key drills are unchanged."""
        w = self.world
        sys_msg, _ = self.system(rng)
        msgs = [sys_msg]
        pos = self.count(sys_msg) + 1  # + BOS
        reserve = self.count({"role": "user", "content": "Okay"})

        def one_word_off(f: Fact) -> tuple[str, str]:
            adj, noun = f.thing.split(" ", 1)
            part = rng.randrange(3)
            return (rng.choice(w.code_attrs) if part == 0 else f.attr,
                    f"{rng.choice(w.thing_adj) if part == 1 else adj} {rng.choice(w.thing_noun) if part == 2 else noun}")

        while True:
            k = rng.randint(2, 4)
            taken: set[tuple[str, str]] = set()
            facts: list[Fact] = []
            codes: list[Fact] = []  # the facts that are codes, for one-word-off keys
            while len(facts) < k:
                if spec.drill_slots and rng.random() < spec.drill_slots:
                    slot, vk = rng.choice(w.slots)
                    f = Fact("slot", slot, "", vk, make_value(rng, vk, w))
                else:
                    f = Fact("code", rng.choice(w.code_attrs), f"{rng.choice(w.thing_adj)} {rng.choice(w.thing_noun)}", "num5",
                             make_value(rng, "num5", w) if rng.random() < 0.8 else code_value(rng, w))
                if f.kind == "code" and codes and rng.random() < KEY_DRILL_SIBLINGS:
                    f.attr, f.thing = one_word_off(rng.choice(codes))
                if f.key in taken:
                    continue
                taken.add(f.key)
                facts.append(f)
                if f.kind == "code":
                    codes.append(f)
            block: list[Message] = []
            i = 0
            while i < k:
                n = rng.randint(1, 3)
                block += [{"role": "user", "content": " ".join(f.statement(rng, w) for f in facts[i:i + n])},
                          {"role": "assistant", "content": rng.choice(w.acks)}]
                i += n
            if spec.drill_updates and rng.random() < spec.drill_updates:
                f = rng.choice(facts)
                old = f.value
                while f.value == old:
                    f.value = make_value(rng, f.value_kind, w)
                block += [{"role": "user", "content": f.statement(rng, w, update=True)},
                          {"role": "assistant", "content": rng.choice(w.update_acks)}]
            questions = [(f, False) for f in facts]
            for _ in range(rng.randint(*spec.drill_ghosts)):
                if spec.drill_slots and rng.random() < spec.drill_slots:
                    g = Fact("slot", rng.choice(w.slots)[0], "", "slot")
                elif not codes or spec.far_ghosts and rng.random() < spec.far_ghosts:
                    g = Fact("code", rng.choice(w.code_attrs), f"{rng.choice(w.thing_adj)} {rng.choice(w.thing_noun)}", "code")
                else:
                    g = Fact("code", *one_word_off(rng.choice(codes)), "code")
                if g.key not in taken:
                    questions.append((g, True))
            rng.shuffle(questions)
            for f, ghost in questions:
                block += [{"role": "user", "content": f.question(rng, w)},
                          {"role": "assistant", "content": f.not_told(spec.key_local) if ghost else f.answer()}]
            full = False
            for m in block:
                n = self.count(m)
                if pos + n > spec.length - reserve:
                    full = True
                    break
                msgs.append(m)
                pos += n
            if full:
                break
        if msgs[-1]["role"] == "user":  # never end on an unanswered question
            pos -= self.count(msgs.pop())
        msgs.append(self.pad(rng, spec.length - pos))
        return msgs

    def pad(self, rng: random.Random, n: int) -> Message:
        """A closing user message of exactly `n` tokens (its tokens are never targets)."""
        words = ["Okay"]
        msg = {"role": "user", "content": "Okay"}
        while self.count(msg) < n:
            words.append(rng.choice(self.pad_words) if self.pad_words else "ok")
            msg = {"role": "user", "content": " ".join(words)}
        if self.count(msg) > n:  # a tokenizer without 1-token words (byte-level): add dots
            words = ["Okay"]
            msg = {"role": "user", "content": "Okay"}
            while self.count(msg) < n:
                words[-1] += "."
                msg = {"role": "user", "content": " ".join(words)}
        if self.count(msg) != n:
            raise RuntimeError(f"cannot pad a dialogue to exactly {n} more tokens (got {self.count(msg)})")
        return msg
