"""Everyday requests: the anchors' (answered by the teacher, trained on) and a held-out set
(never an anchor; scored for replies that claim the user said something they did not).

`ANCHOR_REQUESTS` are generated from templates and slots (seeded, a few hundred, about a
third mentioning the user's own things but asking for something new: "Suggest a name for
my bakery." is where run7 invented 'You said the bakery is called ...'), then `SOCIAL_REQUESTS`
(greetings, thanks, questions about the assistant). `HELDOUT_REQUESTS` is a fixed,
hand-written list of 64, fixed before any training, and `HELDOUT_SOCIAL` 32 social turns,
fixed before run H: none of them is an anchor nor a near copy of one
(tests/recipes/test_answer_mix.py).
"""

from __future__ import annotations

import random
import re

# The 40 requests of the first anchor runs (run6, run7), kept among the anchors.
BASE_REQUESTS = (
    "Write a short poem about the sea.", "How do I fry an egg?", "Explain photosynthesis simply.",
    "Give me two ideas for a birthday gift.", "What is the capital of Japan?", "How far is the moon from the earth?",
    "Write a thank-you note to a neighbor.", "What does a CPU do?", "Suggest a name for a pet goldfish.",
    "Why do leaves change color in autumn?", "List three exercises I can do at home.", "How many days are in a leap year?",
    "What is the difference between weather and climate?", "Give me a tip for learning to cook.", "What is 12 times 12?",
    "Tell me a fun fact about elephants.", "How do I write a good cover letter?", "What are the planets in our solar system?",
    "Explain what a noun is.", "How can I save money on groceries?", "Write one sentence about friendship.",
    "What causes rain?", "Recommend a hobby for a rainy day.", "What language is spoken in Brazil?",
    "How do I keep a houseplant alive?", "Describe a sunset in one sentence.", "What is the tallest mountain on earth?",
    "How do vaccines work?", "Give me a quick breakfast idea.", "What is a prime number?",
    "How do I calm down before a presentation?", "Summarize the story of Cinderella in two sentences.",
    "What's the best way to learn to type faster?", "Why do cats purr?", "What is gravity?",
    "Write a short riddle.", "What should I pack for a beach day?", "How does a rainbow form?",
    "Name three famous painters.", "What is the freezing point of water?",
)

# (template, slot values): "{x}" is filled from the values.
_TEMPLATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Write a short poem about {x}.", ("the sea", "a lighthouse", "snowfall", "a city at night", "old shoes", "a quiet library",
                                       "the first day of spring", "a train journey", "a thunderstorm", "a garden in July")),
    ("How do I {x}?", ("fry an egg", "iron a shirt", "change a bike tire", "make pancakes", "clean a cast iron pan",
                       "start a compost pile", "tie a tie", "bake bread", "sharpen a kitchen knife", "repot a plant",
                       "remove a coffee stain", "make cold brew coffee", "fold a fitted sheet", "cook rice on the stove")),
    ("Explain {x} simply.", ("photosynthesis", "inflation", "how a fridge works", "what an atom is", "how tides work",
                             "what a budget is", "how the internet works", "why we have seasons", "what DNA is", "compound interest")),
    ("What is the capital of {x}?", ("Japan", "Canada", "Kenya", "Peru", "Norway", "Egypt", "Australia", "Vietnam", "Chile", "Greece")),
    ("Tell me a fun fact about {x}.", ("elephants", "octopuses", "the moon", "honey", "penguins", "volcanoes", "bananas", "owls",
                                       "the ocean", "ants")),
    ("Give me {x}.", ("two ideas for a birthday gift", "a quick breakfast idea", "three exercises I can do at home",
                      "a tip for learning to cook", "five words that rhyme with light", "a simple dinner recipe",
                      "three ways to save money on groceries", "an idea for a rainy afternoon", "a tongue twister",
                      "two tips for staying focused")),
    ("Why do {x}?", ("leaves change color in autumn", "cats purr", "onions make us cry", "we yawn", "birds migrate",
                     "stars twinkle", "bread rise", "ice cubes float", "we get hiccups", "cakes sink in the middle")),
    ("What is the difference between {x}?", ("weather and climate", "a virus and bacteria", "baking soda and baking powder",
                                             "a lake and a pond", "speed and velocity", "a crocodile and an alligator")),
    ("Write a {x}.", ("thank-you note to a neighbor", "short riddle", "one-sentence story about a lost key",
                      "polite note asking to borrow a ladder", "short toast for a wedding", "limerick about a cat",
                      "two-line motivational quote", "short welcome message for a new club member")),
    ("Recommend {x}.", ("a hobby for a rainy day", "a board game for four people", "a way to relax after work",
                        "a houseplant that is hard to kill", "a good first book about space", "a warm soup for winter")),
    # The user's own things, asking for something new: the answer is invented fresh, never "you said".
    ("Suggest a name for my {x}.", ("bakery", "podcast", "band", "sailboat", "coffee shop", "gardening blog", "new puppy",
                                    "book club", "food truck", "hiking group", "knitting shop", "youtube channel", "startup",
                                    "goldfish", "vegetable garden")),
    ("Write a birthday message for my {x}.", ("sister", "coworker", "grandfather", "best friend", "neighbor", "son", "aunt")),
    ("Give me a slogan for my {x}.", ("bike repair shop", "lemonade stand", "cleaning business", "bookshop", "yoga studio",
                                      "pizza place")),
    ("Plan a simple menu for my {x}.", ("dinner party", "picnic", "kid's birthday", "game night", "brunch with friends")),
    ("Help me write a short ad for my {x}.", ("old bike", "spare room", "used sofa", "guitar lessons", "dog walking service",
                                              "handmade candles")),
    ("What should I pack for my {x}?", ("beach day", "camping trip", "weekend in the mountains", "first day at a new job",
                                        "long flight")),
    ("Give me three ideas to decorate my {x}.", ("living room", "balcony", "office desk", "classroom", "front door")),
    ("How can I make my {x} better?", ("morning routine", "sleep", "resume", "garden soil", "handwriting", "running pace")),
    ("What is {x}?", ("12 times 12", "a prime number", "gravity", "a haiku", "the tallest mountain on earth",
                      "the freezing point of water", "a verb", "the speed of light", "a leap year", "a metaphor")),
    ("How far is {x}?", ("the moon from the earth", "the sun from the earth", "a marathon", "the horizon at sea",
                         "London from Paris")),
    ("What does {x} do?", ("a CPU", "a thermostat", "the liver", "a dishwasher's rinse aid", "a pharmacist", "an editor",
                           "a router", "a carburetor", "a lifeguard", "the spleen")),
    ("Name three {x}.", ("famous painters", "planets", "types of clouds", "musical instruments with strings", "birds of prey",
                         "vegetables that grow underground", "board games", "breeds of dog", "rivers in Africa", "herbs for cooking")),
    ("How can I {x}?", ("save money on groceries", "calm down before a presentation", "keep a houseplant alive",
                        "learn to type faster", "sleep better on hot nights", "get better at chess", "remember names",
                        "make my coffee taste less bitter", "stop procrastinating", "keep my phone battery healthy",
                        "make new friends in a new city", "practice a new language every day")),
    ("Describe {x} in one sentence.", ("a sunset", "a busy market", "fresh snow", "a summer thunderstorm", "a cup of hot cocoa",
                                       "an empty beach in winter", "a crowded train")),
    ("Can you help me plan {x}?", ("a day trip to the countryside", "a budget for the month", "a study schedule for exams",
                                   "a vegetable garden", "a surprise party", "a week of packed lunches")),
    ("Give me a fun name for my {x}.", ("fantasy football team", "trivia team", "sourdough starter", "bicycle", "camper van",
                                        "wifi network", "cooking club", "quiz night")),
    ("Come up with a story idea about my {x}.", ("old teddy bear", "grandfather's watch", "first car", "favorite mug",
                                                 "childhood treehouse")),
    ("Suggest a theme for my {x}.", ("birthday party", "office holiday party", "classroom bulletin board", "garden party",
                                     "photo album")),
    ("Tell me how to {x}.", ("whistle loudly", "plant tulip bulbs", "make a paper airplane", "read a map", "wash a wool sweater",
                             "brew green tea", "poach an egg", "jump start a car")),
    ("What's a good way to {x}?", ("start journaling", "warm up before a run", "learn the guitar", "organize a closet",
                                   "meet my neighbors", "spend a lazy Sunday", "use leftover rice", "teach a child to ride a bike",
                                   "pack a suitcase", "clean windows without streaks")),
    # Run 3: short factual questions phrased like memory questions, jokes and naming the
    # user's own things: run 2 answered some of these kinds with "you haven't told me".
    ("How many {x}?", ("wheels does a tricycle have", "sides does a hexagon have", "legs does an insect have",
                       "players are on a soccer team", "strings does a violin have", "hearts does an octopus have",
                       "continents are there", "minutes are in a day", "bones are in the human body", "keys does a piano have")),
    ("What year did {x}?", ("the Titanic sink", "World War II end", "the Berlin Wall fall", "the first iPhone come out",
                            "Columbus reach the Americas", "the French Revolution begin")),
    ("Who {x}?", ("wrote Romeo and Juliet", "painted the Mona Lisa", "invented the telephone", "discovered penicillin",
                  "was the first person in space", "composed the Moonlight Sonata", "wrote Pride and Prejudice")),
    ("Tell me a joke about {x}.", ("cats", "computers", "vegetables", "the weather", "dentists", "cheese", "pirates", "math")),
    ("What should I name my {x}?", ("new goldfish", "parrot", "vintage car", "houseboat", "garden gnome", "sourdough bakery",
                                    "tortoise", "home office")),
    ("Pick a {x} for me.", ("random number between one and ten", "color for a scarf", "movie to watch tonight",
                            "book to read on vacation", "board game for tonight", "fruit for a smoothie")),
    ("Which is {x}?", ("bigger, the sun or the moon", "faster, a cheetah or a horse", "colder, the Arctic or a freezer",
                       "older, the pyramids or the Colosseum")),
    ("List {x}.", ("three things to see in Rome", "four healthy snacks", "five classic novels", "three ways to reuse glass jars",
                   "four indoor games for kids", "three questions to ask at a job interview", "five easy houseplants",
                   "three tips for a first camping trip")),
    ("Summarize {x} in two sentences.", ("the story of Cinderella", "the plot of Romeo and Juliet", "how a bill becomes a law",
                                         "the water cycle", "the life of a butterfly")),
)


_PAIRS = (("poem", "grandmother"), ("toast", "brother's wedding"), ("speech", "team"), ("thank-you note", "teacher"),
          ("welcome note", "guests"), ("apology", "neighbor"), ("bio", "website"), ("caption", "holiday photo"),
          ("invitation", "housewarming"), ("description", "handmade soap"), ("song", "dog"), ("review", "favorite cafe"))


_FOR_MY = (("a color scheme", "kitchen"), ("a weekly chore chart", "family"), ("a reading list", "book club"),
           ("some games", "sleepover"), ("a logo idea", "bakery"), ("a welcome sign", "shop"), ("a warm-up", "soccer team"),
           ("a snack", "hike"), ("a gift", "teacher"), ("a dessert", "dinner party"), ("a route", "morning walk"),
           ("a pet name", "hamster"), ("a playlist", "party"), ("a quiz question", "trivia night"))


# Social turns: greetings, thanks, goodbyes, how-are-you, questions about the assistant, a
# word about the user's mood. The shipped delta of 2026-12-05 answered "Say hi." with "You
# said you're a chatbot" and "What's your name?" with "You haven't told me your name": no
# anchor had been a social turn, so nothing held the base's replies to them in place.
# Appended after the shuffled requests above, so the teacher's earlier replies keep their order.
SOCIAL_REQUESTS: tuple[str, ...] = (
    "Hi!", "Hi there.", "Hey.", "Hello, anyone there?", "Good evening!", "Greetings!", "Hey, good to see you.",
    "Hello again.", "Howdy!", "Hi, I'm new here.",
    "How is life treating you?", "How have you been?", "Are you doing okay?", "How is everything with you?",
    "What is your name?", "Do you have a name?", "Who made you?", "Are you a robot?", "Are you a human?",
    "What are you exactly?", "Tell me about yourself.", "Introduce yourself, please.", "What are you good at?",
    "What kinds of things can you help with?", "Do you ever get tired?", "Can you think for yourself?",
    "Thank you!", "Thanks a lot.", "Great, thanks.", "Many thanks for that.", "That was helpful, thank you.",
    "OK.", "Cool.", "Got it.", "Perfect.", "Alright then.", "Sounds great.", "Wow.", "Interesting!", "I see.",
    "Bye!", "See you later.", "Good night, talk soon.", "I have to go now.", "Talk to you tomorrow.",
    "I'm so sleepy.", "I had a long day at work.", "I'm feeling a bit down.", "I'm really happy today!",
    "It's so hot outside.", "I just woke up.", "I can't focus today.",
    "Say something nice.", "Say hello to my friend Sam.", "Cheer me up.", "Surprise me.", "Say something funny.",
    "Can I ask you something?", "Are you busy?", "Let's talk.",
)


def anchor_requests(seed: int = 0) -> tuple[str, ...]:
    """Every filled template once, in a seeded order (the teacher answers them in this order,
    so a resumed run continues where it stopped)."""
    out = [t.replace("{x}", x) for t, xs in _TEMPLATES for x in xs]
    out += [f"Write a short {x} for my {y}." for x, y in _PAIRS]
    out += [f"Could you suggest {x} for my {y}?" for x, y in _FOR_MY]
    out += list(BASE_REQUESTS)
    random.Random(f"answer-requests/{seed}").shuffle(out)
    return tuple(dict.fromkeys([*out, *SOCIAL_REQUESTS]))  # the social ones last: earlier anchors keep their order


ANCHOR_REQUESTS = anchor_requests()

# Fixed before any training. Never anchors, never in dialogues; about a third mention the
# user's own things (where an invented "you said" is most likely).
HELDOUT_REQUESTS: tuple[str, ...] = (
    "Write a haiku about autumn leaves.", "How do I make a good cup of tea?", "Explain what a black hole is in two sentences.",
    "Give me three tips for a job interview.", "What is the boiling point of water at sea level?",
    "Translate 'thank you very much' into Spanish.", "Write a short email telling my team the meeting is cancelled.",
    "What are the primary colors?", "Suggest a name for a small bakery.", "Why is the sky blue?",
    "List four fruits that are high in vitamin C.", "How many legs does a spider have?",
    "Can you draft a text inviting my cousins to a barbecue?", "Think up a title for my travel journal.",
    "I'm opening a flower stall. What could I call it?", "Describe my ideal weekend in a few lines, you pick the details.",
    "Write a bedtime story for my daughter about a brave turtle.", "Create a workout plan for my lunch break.",
    "Compose a farewell card for my colleague who is retiring.", "Brainstorm names for my chess club.",
    "Help me choose a theme for my wedding reception.", "Draft a message to my landlady about a leaking tap.",
    "What could I cook tonight with potatoes and spinach?", "Invent a name for my robot vacuum.",
    "Write a cheerful note for my roommate's fridge.", "Suggest a motto for my running club.",
    "Pick three songs for my road trip playlist.", "Make up a secret handshake for my kids.",
    "Outline a short speech for my grandmother's ninetieth.", "Name my new houseplant, something funny please.",
    "What colours would suit my small bedroom walls?", "How should I arrange the furniture in my tiny studio?",
    "How does a compass work?", "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "What do bees do in winter?", "Tell me how to whistle with my fingers.", "Give me a synonym for happy.",
    "Convert 5 miles to kilometres.", "What year did the first person walk on the moon?", "How do I stop a door from squeaking?",
    "What's a good stretch for a stiff neck?", "Share a joke about penguins.", "What is a noun phrase?",
    "Why does bread go stale?", "How long should I boil pasta?", "Describe the smell of rain.",
    "What are three uses for baking soda?", "How do whales sleep?", "Write a two-line poem about coffee.",
    "Explain what a mortgage is.", "Give me a riddle about time.", "What makes a good password?",
    "How do I care for a wooden cutting board?", "List five animals that live in the desert.",
    "What is the largest ocean?", "Tell me something interesting about the Eiffel Tower.",
    "How can I learn to juggle?", "Why do we have leap seconds?", "Write a short note to cheer up a friend.",
    "What should I name a grey kitten?", "Suggest a fun activity for a family reunion.", "Explain how a bicycle stays upright.",
    "What is the opposite of generous?", "How do I politely decline an invitation?",
)

# Social turns held out like the requests above: never anchors nor near copies of one, nor of
# the dialogues' small talk; fixed before the run that trained the social anchors.
HELDOUT_SOCIAL: tuple[str, ...] = (
    "Say hi.", "Hello!", "How are you?", "Who are you?", "What's your name?", "Thanks!", "Can you help me?",
    "What can you do?", "Hi, nice to meet you.", "Hey, what's up?", "Morning! Sleep well?", "Are you an AI?",
    "Do you have feelings?", "Thank you so much, that was useful.", "Okay, sounds good.", "Goodbye!",
    "See you next week.", "Nighty night.", "I'm starving.", "I feel lonely tonight.", "Today was a good day.",
    "I'm back.", "Tell me something about you.", "Are you still there?", "Nice!", "Haha, that's funny.",
    "What should I call you?", "Where do you come from?", "Can we chat for a bit?", "I need some advice.",
    "Hmm, let me think.", "Yo.",
)

# A reply that claims the user said something: in a fresh chat, with nothing said before,
# every such claim is invented.
INVENTED = re.compile(r"\byou(?:'ve| have)? (?:said|told me|mentioned)\b|\bas you (?:said|mentioned|told me)\b|"
                      r"\byou(?:'ve| have) already told me\b", re.I)


def claims_user_said(reply: str) -> bool:
    """Whether `reply` claims the user said or told something (the held-out chat score)."""
    return bool(INVENTED.search(reply))
