"""The training concepts of the answer recipe: everyday details, hand-written, each with
statements, questions, an answer and a "not told" reply.

None of them is a detail type that `laplace probe natural` asks about (agent/probes/
natural_text.py): no concept name, no key word and no phrasing is shared, and the values
come from pools disjoint from the probe's. `SPLIT_HELDOUT` concepts are kept out of
training too, for the recipe's own held-out eval loss. Tests check all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Disjoint from agent.probes.natural_text.HELDOUT_VALUES (a test checks it).
TRAIN_VALUES: dict[str, tuple[str, ...]] = {
    "person": tuple("Alice Ben Clara David Emma Frank Grace Henry Irene Jack Laura Mark Nora Oscar Paula Ryan Sara Tom Uma "
                    "Victor Wendy Yusuf Zoe Leo Mia Noah Eva Liam Ava Ethan Lily Max Ruby Sam Tara Owen Iris Kai Nina Pete "
                    "Anna Felix Hannah Igor Julia Karl Lena Mona Omar Rosa".split()),
    "place": tuple("Boston Denver Austin Oslo Lisbon Dublin Madrid Prague Vienna Zurich Seattle Chicago Toronto Sydney Milan "
                   "Porto Nairobi Lima Quebec Glasgow Naples Leeds Osaka Perth".split()),
    "food": ("peanuts", "shellfish", "gluten", "eggs", "milk", "strawberries", "pasta", "sushi", "tacos", "curry", "pizza",
             "soup", "pancakes", "noodles", "dumplings", "lasagna", "oranges", "almonds"),
    "color": ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "teal", "pink", "silver", "grey"),
    "job": ("nurse", "teacher", "plumber", "baker", "pilot", "lawyer", "chef", "designer", "farmer", "mechanic",
            "architect", "journalist", "carpenter"),
    "month": ("February", "April", "June", "August", "October", "December"),
}


@dataclass(frozen=True)
class TrainConcept:
    """One detail: its value kind, statements and questions ({v} is the value), the
    assistant's answers and its replies when the detail was never given."""

    name: str
    kind: str
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    answers: tuple[str, ...]
    not_told: tuple[str, ...]


def _c(name: str, kind: str, statements: str, questions: str, answers: str, not_told: str) -> TrainConcept:
    split = lambda s: tuple(p.strip() for p in s.split("|") if p.strip())  # noqa: E731
    return TrainConcept(name, kind, split(statements), split(questions), split(answers), split(not_told))


CONCEPTS: tuple[TrainConcept, ...] = (
    _c("neighbor", "person",
       "My neighbor {v} lent me a ladder today. | The guy next door, {v}, is my neighbor and he's very loud. | Our neighbor is called {v}.",
       "What's my neighbor's name? | Who is my neighbor again? | Do you remember what my neighbor is called?",
       "Your neighbor is {v}. | You said your neighbor is called {v}.",
       "You haven't told me your neighbor's name. | I don't know, you never told me who your neighbor is."),
    _c("niece", "person",
       "My niece {v} turns six next week. | I'm babysitting my niece, {v}, tonight. | My niece is called {v}.",
       "What's my niece called? | Who's my niece? | Can you tell me my niece's name?",
       "Your niece is called {v}. | You told me your niece's name is {v}.",
       "You haven't told me your niece's name. | You never told me about a niece, so I don't know."),
    _c("landlord", "person",
       "My landlord {v} still hasn't fixed the heating. | I pay rent to a landlord called {v}. | The landlord's name is {v}.",
       "Who is my landlord? | What's the name of my landlord? | Do you remember my landlord's name?",
       "Your landlord is {v}. | You said your landlord is called {v}.",
       "You haven't told me who your landlord is. | I don't know your landlord's name; you didn't tell me."),
    _c("coworker", "person",
       "A coworker of mine, {v}, brought cake today. | I share a desk with my coworker {v}. | My coworker {v} is out sick.",
       "What's my coworker's name? | Who is the coworker I mentioned? | Remind me of my coworker's name.",
       "Your coworker is {v}. | You mentioned your coworker {v}.",
       "You haven't told me your coworker's name. | You didn't tell me about a coworker."),
    _c("grandmother", "person",
       "My grandmother {v} is ninety this year. | I visited my grandmother, {v}, on Sunday. | Grandma's name is {v}.",
       "What is my grandmother's name? | Who is my grandma? | Do you remember what my grandmother is called?",
       "Your grandmother is {v}. | You said your grandmother's name is {v}.",
       "You haven't told me your grandmother's name. | I don't know, you never told me her name."),
    _c("parrot", "person",
       "My parrot {v} learned a new word. | We have a parrot named {v}. | Our parrot is called {v} and he never stops talking.",
       "What is my parrot called? | What's the name of our parrot? | Do you remember my parrot's name?",
       "Your parrot is called {v}. | You said your parrot's name is {v}.",
       "You haven't told me your parrot's name. | You never told me about a parrot."),
    _c("roommate", "person",
       "My roommate {v} ate my leftovers again. | I live with a roommate called {v}. | My roommate's name is {v}.",
       "Who is my roommate? | What's my roommate called? | Can you remind me of my roommate's name?",
       "Your roommate is {v}. | You told me your roommate is {v}.",
       "You haven't told me your roommate's name. | I don't know; you didn't tell me about a roommate."),
    _c("vacation", "place",
       "We're going on vacation to {v} in August. | Our vacation this year is in {v}. | I booked a vacation in {v}.",
       "Where am I going on vacation? | Where is our vacation this year? | Do you remember where my vacation is?",
       "Your vacation is in {v}. | You said you're going on vacation to {v}.",
       "You haven't told me where your vacation is. | You didn't tell me where you're going on vacation."),
    _c("university", "place",
       "I studied at the university in {v}. | I went to university in {v}, a long time ago. | My university was in {v}.",
       "Where did I go to university? | Which city was my university in? | Do you remember where I studied?",
       "You went to university in {v}. | You said you studied in {v}.",
       "You haven't told me where you went to university. | I don't know; you never told me where you studied."),
    _c("parents", "place",
       "My parents live in {v} these days. | I'm flying home to see my parents in {v}. | Mom and dad still live in {v}.",
       "Where do my parents live? | Which city are my parents in? | Do you remember where my parents live?",
       "Your parents live in {v}. | You said your parents are in {v}.",
       "You haven't told me where your parents live. | You didn't tell me where your parents live."),
    _c("lunch", "food",
       "I had {v} for lunch today. | Lunch was {v} again. | For lunch I ordered {v}.",
       "What did I have for lunch? | What was my lunch today? | Do you remember what I ate for lunch?",
       "You had {v} for lunch. | You said lunch was {v}.",
       "You haven't told me what you had for lunch. | I don't know what you ate for lunch; you didn't say."),
    _c("dislike", "food",
       "I really can't stand {v}. | Please, no {v}, I hate it. | The one thing I dislike eating is {v}.",
       "What food do I hate? | Which food can't I stand? | Do you remember what I dislike eating?",
       "You can't stand {v}. | You said you dislike {v}.",
       "You haven't told me about any food you dislike. | You never told me what food you hate."),
    _c("bike", "color",
       "My bike is the {v} one by the gate. | I ride a {v} bike to work. | I bought a {v} bike last week.",
       "What color is my bike? | Which bike is mine? | Do you remember the color of my bike?",
       "Your bike is {v}. | You said your bike is the {v} one.",
       "You haven't told me what color your bike is. | I don't know; you didn't tell me about your bike."),
    _c("umbrella", "color",
       "I left my {v} umbrella at the cafe. | My umbrella is {v} with white dots. | I always carry a {v} umbrella.",
       "What color is my umbrella? | Which umbrella did I say is mine? | Do you remember my umbrella's color?",
       "Your umbrella is {v}. | You said your umbrella is {v}.",
       "You haven't told me what color your umbrella is. | You never told me about an umbrella."),
    _c("partner_job", "job",
       "My partner works as a {v}. | My wife is a {v} at the hospital down the road. | My husband has been a {v} for years.",
       "What does my partner do for a living? | What is my partner's job? | Do you remember my partner's job?",
       "Your partner is a {v}. | You said your partner works as a {v}.",
       "You haven't told me what your partner does. | I don't know your partner's job; you didn't tell me."),
    _c("dad_job", "job",
       "My dad was a {v} his whole life. | My father works as a {v}. | Dad is a {v}, like his father before him.",
       "What does my dad do? | What was my father's job? | Do you remember my dad's job?",
       "Your dad is a {v}. | You said your father works as a {v}.",
       "You haven't told me what your dad does. | You never told me your father's job."),
    _c("platform", "num1",
       "The train leaves from platform {v}. | We meet at platform {v}. | Platform {v} is where I catch my train.",
       "Which platform does my train leave from? | What platform are we meeting at? | Do you remember the platform number?",
       "Platform {v}. | You said platform {v}.",
       "You haven't told me the platform. | I don't know the platform; you didn't tell me."),
    _c("table", "num2",
       "We got table {v} at the restaurant. | Our table tonight is number {v}. | The restaurant put us at table {v}.",
       "Which table are we at? | What's our table number? | Do you remember our table at the restaurant?",
       "Your table is number {v}. | You said you're at table {v}.",
       "You haven't told me your table number. | You didn't tell me which table you have."),
    _c("house", "num3",
       "We live at number {v} on Elm Street. | Our house number is {v}. | Deliveries go to house number {v}.",
       "What's my house number? | Which number is our house? | Do you remember my house number?",
       "Your house number is {v}. | You said you live at number {v}.",
       "You haven't told me your house number. | I don't know your house number; you never told me."),
    _c("shoe", "num2",
       "I wear size {v} shoes. | My shoe size is {v}. | Get me the boots in size {v}, that's my shoe size.",
       "What's my shoe size? | Which size shoes do I wear? | Do you remember my shoe size?",
       "Your shoe size is {v}. | You said you wear size {v}.",
       "You haven't told me your shoe size. | You didn't tell me your shoe size."),
    _c("tracking", "num5",
       "The parcel's tracking number is {v}. | Tracking says {v} for my package. | My package has tracking number {v}.",
       "What's the tracking number of my parcel? | Can you give me my package's tracking number? | Do you remember the tracking number?",
       "The tracking number is {v}. | You said the tracking number is {v}.",
       "You haven't told me a tracking number. | I don't know the tracking number; you didn't give it to me."),
    _c("extension", "num4",
       "My phone extension at the office is {v}. | Call me on extension {v}. | The office put me on extension {v}.",
       "What's my phone extension? | Which extension am I on? | Do you remember my extension number?",
       "Your extension is {v}. | You said your extension is {v}.",
       "You haven't told me your extension. | You never told me your phone extension."),
    _c("anniversary", "date",
       "Our wedding anniversary is {v}. | We got married on {v}, so that's our anniversary. | Don't let me forget our anniversary, {v}.",
       "When is our anniversary? | What date is my wedding anniversary? | Do you remember our anniversary?",
       "Your anniversary is {v}. | You said your anniversary is on {v}.",
       "You haven't told me your anniversary. | I don't know your anniversary; you didn't tell me."),
    _c("exam", "date",
       "My driving exam is on {v}. | The exam got scheduled for {v}. | I have my big exam on {v}.",
       "When is my exam? | What day is the exam? | Do you remember the date of my exam?",
       "Your exam is on {v}. | You said the exam is on {v}.",
       "You haven't told me when your exam is. | You never told me about an exam."),
    _c("alarm", "time",
       "I set my alarm for {v}. | My alarm goes off at {v} every day. | Wake me up at {v}, that's when my alarm is.",
       "What time is my alarm? | When does my alarm go off? | Do you remember when I set my alarm for?",
       "Your alarm is set for {v}. | You said your alarm goes off at {v}.",
       "You haven't told me when your alarm is. | I don't know; you didn't tell me your alarm time."),
    _c("yoga", "time",
       "Yoga class starts at {v}. | I go to yoga at {v} on Tuesdays. | My yoga class moved to {v}.",
       "What time is my yoga class? | When do I go to yoga? | Do you remember when yoga starts?",
       "Your yoga class is at {v}. | You said yoga starts at {v}.",
       "You haven't told me when your yoga class is. | You never told me about a yoga class."),
    _c("username", "word",
       "My username on the forum is {v}. | I log in as {v}. | Log me in as {v}, that's my username.",
       "What's my username? | Which username do I use? | Do you remember my username?",
       "Your username is {v}. | You said you log in as {v}.",
       "You haven't told me your username. | I don't know your username; you didn't tell me."),
    _c("boat", "word",
       "My uncle named his boat {v}. | The boat we rented is called {v}. | Our little sailing boat is the {v}.",
       "What's the boat called? | What is the name of the boat? | Do you remember the boat's name?",
       "The boat is called {v}. | You said the boat's name is {v}.",
       "You haven't told me the boat's name. | You never told me about a boat."),
    # Held out of training: the recipe's eval loss reads dialogues about these only.
    _c("godson", "person",
       "My godson {v} starts school in the fall. | I'm the godfather of a boy called {v}. | My godson's name is {v}.",
       "Who is my godson? | What's my godson called? | Do you remember my godson's name?",
       "Your godson is {v}. | You said your godson is called {v}.",
       "You haven't told me your godson's name. | You never told me about a godson."),
    _c("conference", "place",
       "The conference this year is in {v}. | I'm giving a talk at a conference in {v}. | Our team flies to {v} for the conference.",
       "Where is the conference? | Which city is my conference in? | Do you remember where the conference is?",
       "The conference is in {v}. | You said the conference is in {v}.",
       "You haven't told me where the conference is. | I don't know; you didn't tell me about a conference."),
    _c("jersey", "num2",
       "My jersey number on the team is {v}. | I play in jersey number {v}. | The coach gave me jersey {v}.",
       "What's my jersey number? | Which number do I wear on the team? | Do you remember my jersey number?",
       "Your jersey number is {v}. | You said you wear number {v}.",
       "You haven't told me your jersey number. | You didn't tell me your jersey number."),
    _c("haircut", "date",
       "My haircut is booked for {v}. | I'm getting a haircut on {v}. | The barber can do my haircut on {v}.",
       "When is my haircut? | What day did I book the haircut? | Do you remember when my haircut is?",
       "Your haircut is on {v}. | You said the haircut is on {v}.",
       "You haven't told me when your haircut is. | You never told me about a haircut."),
    _c("pickup", "time",
       "I pick the kids up from school at {v}. | School pickup is at {v}. | Pickup time for the kids is {v}.",
       "What time is school pickup? | When do I pick up the kids? | Do you remember the pickup time?",
       "School pickup is at {v}. | You said you pick up the kids at {v}.",
       "You haven't told me the pickup time. | I don't know when pickup is; you didn't tell me."),
)
SPLIT_HELDOUT = frozenset({"godson", "conference", "jersey", "haircut", "pickup"})
TRAIN_CONCEPTS = tuple(c for c in CONCEPTS if c.name not in SPLIT_HELDOUT)
EVAL_CONCEPTS = tuple(c for c in CONCEPTS if c.name in SPLIT_HELDOUT)

ACKS = ("Got it.", "Okay, noted.", "Thanks, I'll keep that in mind.", "Good to know.", "All right, I'll remember that.", "Noted.")

# Small talk around the details: (user, assistant), the assistant short and friendly.
SMALL_TALK: tuple[tuple[str, str], ...] = (
    ("How's your day going?", "It's going well, thanks for asking. How about yours?"),
    ("It's raining again here.", "Sorry to hear that. A good day for a warm drink and a book, maybe."),
    ("I'm a bit tired today.", "That happens. Try to take a short break and drink some water."),
    ("Any tips for sleeping better?", "Keep a regular bedtime, avoid screens late at night, and keep your room cool and dark."),
    ("I just finished a great book.", "Nice! What did you like most about it?"),
    ("What's a good quick dinner?", "A stir-fry is quick: vegetables, some protein, soy sauce and rice, ready in about twenty minutes."),
    ("Can you give me a fun fact?", "Sure: octopuses have three hearts and blue blood."),
    ("I want to start running.", "Great idea. Start slow, with short runs a few times a week, and build up gradually."),
    ("Thanks for the help earlier.", "You're welcome! Happy to help any time."),
    ("What's a good name for a plant?", "How about Fernando for a fern, or Spike for a cactus?"),
    ("I'm thinking about learning Spanish.", "That's a great goal. A few minutes of practice every day goes a long way."),
    ("The weekend went by so fast.", "Weekends always do. Did you get to do anything fun?"),
    ("What's two plus two?", "Two plus two is four."),
    ("Do you like music?", "I don't listen to music myself, but I'm happy to talk about it or suggest some."),
    ("I need to clean my kitchen.", "Start with the dishes, then wipe the counters, and finish with the floor."),
    ("Tell me a short joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("How do I boil an egg?", "Put the egg in boiling water for about nine minutes, then cool it in cold water."),
    ("I'm bored.", "Maybe take a short walk, call a friend, or try a new recipe."),
    ("What's the capital of France?", "The capital of France is Paris."),
    ("Good morning!", "Good morning! What can I do for you today?"),
)
