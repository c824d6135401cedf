"""Build the demo model's data: tokenizer, staged training files and held-out files.

Everything is a pure function of the seed and the interpreter's own standard library:
- `train_tokenizer`: byte-level BPE (digits split one by one, so every number is copied
  digit by digit with ten well-trained tokens) on the training docstrings and a sample of
  training dialogues; the chat special tokens come first (ids 0..7).
- `write_stage`: one JSONL of dialogues, each exactly `length` tokens (one packed row),
  followed by the training docstrings as plain-text records.
- `prose`: a shuffled share of the wide prose (`corpus.wide_text`) for phase 5's blocks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from recipes.demo_model.corpus import Passage, wide_text
from recipes.demo_model.dialogues import Builder, DialogueSpec, Message
from recipes.demo_model.vocab import HELDOUT, TRAIN, World
from agent.runtime.tokenizer import SPECIAL_TOKENS, ChatTemplate, Tokenizer


TEXT_SHARE = 0.15


def rough_count(m: Message) -> int:
    """Token estimate before a tokenizer exists (only used to sample tokenizer text)."""
    return 3 + len(m["content"]) // 4


def train_tokenizer(passages: list[Passage], seed: int, vocab_size: int) -> Tokenizer:
    rng = random.Random(seed * 7 + 1)
    b = Builder(TRAIN, passages, rough_count)
    texts = [p.text for p in passages]
    for _ in range(3000):
        texts += [m["content"] for m in b.dialogue(rng, DialogueSpec(length=512, gap_min=0, gap_max=256))]
    hf = HFTokenizer(models.BPE(unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(hf)


def token_counter(tok: Tokenizer, template: ChatTemplate):  # type: ignore[no-untyped-def]
    cache: dict[tuple[str, str], int] = {}

    def count(m: Message) -> int:
        key = (m["role"], m["content"])
        n = cache.get(key)
        if n is None:
            n = len(template.message(tok, m["role"], m["content"]))
            if len(cache) < 200_000:
                cache[key] = n
        return n

    return count


def pad_words(tok: Tokenizer) -> tuple[str, ...]:
    words = ("ok", "so", "and", "then", "well", "yes", "right", "sure", "fine", "good", "now", "also")
    return tuple(w for w in words if len(tok.encode(" " + w)) == 1)


def make_builder(world: World, passages: list[Passage], tok: Tokenizer, template: ChatTemplate) -> Builder:
    return Builder(world, passages, token_counter(tok, template), pad_words(tok), heldout=world is HELDOUT)


def write_dialogues(path: Path, builder: Builder, rng: random.Random, spec: DialogueSpec, n: int,
                    tok: Tokenizer, template: ChatTemplate) -> int:
    """n dialogues of exactly spec.length tokens as chat JSONL; returns the token count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    total = 0
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            msgs = builder.dialogue(rng, spec)
            # Exact length including the BOS of the first message; checked, since packing
            # depends on it.
            ids = sum((template.message(tok, m["role"], m["content"], first=i == 0) for i, m in enumerate(msgs)), [])
            if len(ids) != spec.length:
                raise RuntimeError(f"dialogue is {len(ids)} tokens, not {spec.length}")
            total += len(ids)
            f.write(json.dumps({"messages": msgs}) + "\n")
    return total


def write_text(path: Path, passages: list[Passage]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps({"text": p.text}) + "\n")


def take_chars(ordered: list[Passage], want: float) -> tuple[list[Passage], int]:
    """Passages from `ordered`, in order, until their text reaches `want` characters (the
    one that crosses it included); returns them and their character count."""
    picked, chars = [], 0
    for p in ordered:
        if chars >= want:
            break
        picked.append(p)
        chars += len(p.text)
    return picked, chars


def prose(rng: random.Random, train: list[Passage], chars: float) -> list[Passage]:
    """About `chars` characters of wide prose (`corpus.wide_text`), shuffled by `rng`."""
    pool = wide_text(train)
    rng.shuffle(pool)
    return take_chars(pool, chars)[0]


def write_stage(folder: Path, *, seed: int, stage: int, spec: DialogueSpec, n_dialogues: int, passages: list[Passage],
                tok: Tokenizer, template: ChatTemplate, world: World = TRAIN, text_share: float = TEXT_SHARE,
                text: list[Passage] | None = None) -> dict:
    """Stage folder: a_dialogues.jsonl (exact rows first) then b_text.jsonl (plain prose from
    `text`, by default the same docstrings the dialogues' chat is drawn from)."""
    rng = random.Random(seed * 1000 + stage)
    builder = make_builder(world, passages, tok, template)
    tokens = write_dialogues(folder / "a_dialogues.jsonl", builder, rng, spec, n_dialogues, tok, template)
    # Plain English is about `text_share` of the stage's tokens (~4 characters a token).
    want_chars = text_share / (1 - text_share) * tokens * 4
    pool = passages if text is None else text
    picked, chars = take_chars(rng.sample(pool, len(pool)), want_chars)
    write_text(folder / "b_text.jsonl", picked)
    return {"stage": stage, "length": spec.length, "gap": [spec.gap_min, spec.gap_max], "dialogues": n_dialogues,
            "dialogue_tokens": tokens, "text_chars": chars, **builder.stats}
