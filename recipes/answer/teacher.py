"""The base model's own replies to everyday requests, to mix into the answer dialogues so
the delta keeps answering requests as the base does (self-distillation as an anchor).

    python -m recipes.answer.teacher -m MODEL_DIR --out replies.jsonl

Greedy, at most `REPLY_TOKENS` tokens; a reply cut before its end is trimmed to its last
full sentence (or dropped), so the model is never taught to stop mid-thought. None of
`REQUESTS` is among recipes/answer/check.py's `PROMPTS` (a test checks it), so the check
stays held out.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from agent.probes.engine import greedy_rows
from agent.runtime.checkpoint import load_model_dir

REPLY_TOKENS = 96
REQUESTS = (
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


def _trim(text: str) -> str | None:
    """The reply up to its last full sentence, or None if that leaves too little."""
    m = list(re.finditer(r"[.!?](\s|$)", text))
    if not m:
        return None
    out = text[: m[-1].end()].strip()
    return out if len(out) >= 20 else None


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_model_dir(a.model)
    tok, t = lm.tokenizer, lm.template
    prompts = [t.message(tok, "system", "", first=True) + t.message(tok, "user", r) + t.reply_prefix(tok) for r in REQUESTS]
    model = lm.model.eval()
    stops = set(t.stop_ids(tok))
    outs = greedy_rows(model, model.new_state(len(prompts)), prompts, REPLY_TOKENS, list(stops))
    kept = 0
    with a.out.open("w", encoding="utf-8") as f:
        for req, ids in zip(REQUESTS, outs):
            ended = len(ids) < REPLY_TOKENS or (ids and ids[-1] in stops)
            text = tok.decode([i for i in ids if i not in stops]).strip()
            reply = text if ended and text else _trim(text)
            if reply:
                f.write(json.dumps({"request": req, "reply": reply}) + "\n")
                kept += 1
    print(f"{kept} of {len(REQUESTS)} replies kept in {a.out}")


if __name__ == "__main__":
    main()
