"""Copying check for phase 6: is a detail given back right after it is said?

    python -m recipes.experiments.natural_check MODEL_DIR

For each of the 26 everyday concepts, one conversation: an empty system turn, the detail
stated, "Okay, noted.", the question, a greedy reply; a hit is the value in the reply.
Six conditions separate the causes: training or held-out phrasings, training, made-up or
the probe's values. Distance 0, so memory plays no part: a miss here is a copying miss.
The last condition begins the reply with the two words said right before the value ("You
said my sister"), so copying needs no lookup by key, only the word that followed a
repeated context (an induction step); concepts without two such words are left out. Each
line splits the hits by the value's kind: words (names, places, foods, colors, jobs,
dates) and numbers (numbers and times), which the models copy very differently.
"""

from __future__ import annotations

import argparse
import random

from agent.probes.natural_text import CONCEPTS, make_value
from agent.runtime.checkpoint import load_model_dir
from recipes.experiments.natural import phrasings, train_value
from recipes.demo_model.recall_eval import greedy

ECHO = "held-out phrasing, probe value, reply begun with the two words said before the value"
CONDITIONS = ("train phrasing, train value", "train phrasing, made-up value", "train phrasing, probe value",
              "held-out phrasing, train value", "held-out phrasing, probe value", ECHO)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    lm = load_model_dir(args.model)
    tok, tpl = lm.tokenizer, lm.template
    rng = random.Random(args.seed)
    for cond in CONDITIONS:
        hits, of, misses = {"words": 0, "numbers": 0}, {"words": 0, "numbers": 0}, []
        for c in CONCEPTS:
            statements, questions, _ = phrasings(c)
            echoed = [st for st in c.statements if len(st.split("{v}")[0].split()) >= 2]
            if cond == ECHO and not echoed:
                continue
            if "probe value" in cond:
                v = make_value(rng, c.kind)
            else:
                v = train_value(rng, c.kind, 1.0 if "made-up" in cond else 0.0)
            held = cond.startswith("held-out")
            said = rng.choice(echoed if cond == ECHO else c.statements if held else statements)
            stmt = said.replace("{v}", v)
            q = rng.choice(c.questions if held else questions)
            ids = (tpl.message(tok, "system", "", first=True) + tpl.message(tok, "user", stmt)
                   + tpl.message(tok, "assistant", "Okay, noted.") + tpl.message(tok, "user", q) + tpl.reply_prefix(tok))
            if cond == ECHO:
                ids += tok.encode("You said " + " ".join(said.split("{v}")[0].split()[-2:]))
            reply, _ = greedy(lm, lm.model.new_state(1), ids, 30)
            kind = "numbers" if c.kind.startswith("num") or c.kind == "time" else "words"
            of[kind] += 1
            if v.lower() in reply.lower():
                hits[kind] += 1
            elif len(misses) < 3:
                misses.append(f"{stmt!r} / {q!r} -> {reply!r}")
        print(f"{cond}: {sum(hits.values())}/{sum(of.values())} (words {hits['words']}/{of['words']}, "
              f"numbers {hits['numbers']}/{of['numbers']})")
        for m in misses:
            print("   ", m)


if __name__ == "__main__":
    main()
