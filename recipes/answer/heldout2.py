"""The second held-out set (issue 36): detail types, phrasings and values that neither the
training mix nor `laplace probe natural` uses, fixed on 2026-12-02 before any issue-36
training run and not to be looked at (or tuned against) until the final measurement.

The probe's shares were tuned after seeing its numbers once; this set was not. Its
concepts are `agent.probes.natural_text.Concept`s, so the probe's own conversation builder
runs them unchanged (`recipes.answer.measure --set heldout2` swaps them in for the probe's
`CONCEPTS` and value pools). Numbers are six digits, times are 24-hour with minutes the
training never draws, dates are weekdays: no value can coincide with a training value.
tests/recipes/test_answer_mix.py checks names, key words, phrasings and value pools against
both the training concepts and the probe.
"""

from __future__ import annotations

from agent.probes.natural_text import Concept, _c

HELDOUT2_VALUES: dict[str, tuple[str, ...]] = {
    "person": ("Quentin", "Beatrix", "Cyrus", "Delphine", "Esteban", "Fiona", "Gideon", "Hazel", "Ingrid", "Jasper",
               "Magnus", "Nadia", "Orla", "Piers", "Silas", "Yvette"),
    "place": ("Hobart", "Quito", "Tbilisi", "Bruges", "Tucson", "Galway", "Antwerp", "Valencia", "Split", "Reno"),
    "food": ("lentils", "sardines", "okra", "rhubarb", "hazelnuts", "chickpeas"),
    "color": ("turquoise", "crimson", "mustard", "lavender", "charcoal", "coral"),
    "job": ("paramedic", "economist", "potter", "geologist", "locksmith", "zookeeper"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"),  # not Sunday: a training statement says it
    "time24": ("13:10", "14:20", "15:40", "16:50", "17:05", "18:25", "19:35", "20:55", "21:10", "22:20"),
    "word": ("quartzlane", "bluefinch", "tidalmoss", "ember-kite", "northwillow", "copperfern", "saltmarsh"),
}

HELDOUT2_CONCEPTS: tuple[Concept, ...] = (
    _c("cousin", "person", "cousin", "Your cousin is called {v}.", "You haven't told me your cousin's name.",
       "My cousin {v} is getting married in the spring. | I spent the afternoon with my cousin {v}.",
       "Which cousin did I mention, what's her name? | Remind me, my cousin is who?"),
    _c("mechanic", "person", "mechanic", "Your mechanic is {v}.", "You haven't told me who your mechanic is.",
       "The mechanic, {v}, says the car needs new brakes. | I always take the car to a mechanic named {v}.",
       "Who's my mechanic again? | What's the mechanic's name?"),
    _c("horse", "person", "horse", "Your horse is called {v}.", "You haven't told me your horse's name.",
       "I ride a chestnut horse called {v} on Sundays. | The stable lets me ride {v}, a gentle old horse.",
       "What's the horse I ride called? | Do you know my horse's name?"),
    _c("piano", "person", "piano", "Your piano teacher is {v}.", "You haven't told me who teaches you piano.",
       "My piano teacher {v} gave me a new piece. | I take piano lessons from {v} every Tuesday.",
       "Who teaches me piano? | What's the name of my piano teacher?"),
    _c("honeymoon", "place", "honeymoon", "Your honeymoon was in {v}.", "You haven't told me where your honeymoon was.",
       "We spent our honeymoon in {v}, years ago now. | For the honeymoon we flew to {v}.",
       "Where did we go on our honeymoon? | Which city was the honeymoon in?"),
    _c("smoothie", "food", "smoothie", "Your smoothie has {v} in it.", "You haven't told me what goes in your smoothie.",
       "Every morning my smoothie has {v} in it. | I blend {v} into my smoothie before work.",
       "What do I put in my smoothie? | Which ingredient goes in my morning smoothie?"),
    _c("scarf", "color", "scarf", "Your scarf is {v}.", "You haven't told me what color your scarf is.",
       "I knitted myself a {v} scarf this winter. | My scarf is {v}, the long woolly one.",
       "What color did I say my scarf was? | Which color is my scarf?"),
    _c("aunt_job", "job", "aunt", "Your aunt is a {v}.", "You haven't told me what your aunt does.",
       "My aunt works as a {v}. | My aunt has been a {v} for ten years.",
       "What does my aunt do for a living? | What's my aunt's job?"),
    _c("library_card", "num6", "library", "Your library card number is {v}.", "You haven't told me your library card number.",
       "My library card number is {v}. | The library gave me card number {v}.",
       "What's my library card number? | Which number is on my library card?"),
    _c("gym_pin", "num6", "pin", "Your gym PIN is {v}.", "You haven't told me your gym PIN.",
       "The gym PIN they gave me is {v}. | To get into the gym I type the PIN {v}.",
       "What PIN gets me into the gym? | Do you remember my gym PIN?"),
    _c("recycling", "weekday", "recycling", "The recycling goes out on {v}.", "You haven't told me which day the recycling goes out.",
       "Recycling gets picked up on {v} on our street. | I have to put the recycling out every {v}.",
       "What day is recycling collected? | When does the recycling go out?"),
    _c("ferry", "time24", "ferry", "Your ferry leaves at {v}.", "You haven't told me when your ferry leaves.",
       "The ferry back to the mainland leaves at {v}. | We have tickets for the {v} ferry.",
       "When does my ferry go? | What time is the ferry?"),
    _c("nickname", "word", "nickname", "Your nickname is {v}.", "You haven't told me your nickname.",
       "Online everyone knows me by the nickname {v}. | My gaming nickname is {v}.",
       "What nickname do I use? | Do you know my nickname?"),
    _c("pottery", "weekday", "pottery", "Your pottery class is on {v}.", "You haven't told me when your pottery class is.",
       "My pottery class meets on {v} evenings. | I signed up for pottery, it's on {v}.",
       "Which day is pottery? | When is my pottery class?"),
)
