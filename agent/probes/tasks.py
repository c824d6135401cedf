"""Behavioural probes: what is planted, what is asked, and which answers compete.

Every probe plants "the code for the {key} is {value}" facts and ends its question with the
cue "the code for the {key} is", so the answer is the value's continuation in both prompt
styles: `completion` (plain text, for base models) and `chat` (messages in the model's own
chat template, for chat models). Distractors have the answer's exact token length, so
summed log-probabilities compare fairly in the forced choice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from agent.runtime.templates import AnyTemplate, SegmentTemplate
from agent.runtime.tokenizer import Tokenizer

from agent.probes import text
from agent.probes.suites import N_CANDIDATES

PROBE_KINDS = ("passkey", "multikey", "update", "order")
STYLES = ("completion", "chat")


def default_style(tok: Tokenizer, template: AnyTemplate) -> str:
    """`chat` when the tokenizer holds the chat template's user, assistant and end tokens
    (a chat model, e.g. the bundled default), else `completion`.

    Completion prompts on a chat model read as noise to it and score 0% everywhere, so
    the model's own template decides rather than a fixed default. An imported model's
    template is chat when it came from the checkpoint's chat template, completion when the
    checkpoint had none (a base model given plain User:/Assistant: turns)."""
    if isinstance(template, SegmentTemplate):
        return "chat" if template.source == "jinja" else "completion"
    needed = [template.role_tokens.get("user"), template.role_tokens.get("assistant"), template.end_token]
    try:
        for token in needed:
            if token is None:
                return "completion"
            tok.token_id(token)
    except KeyError:
        return "completion"
    return "chat"


@dataclass(frozen=True)
class Sample:
    """One planted fact (or set of facts) and its question, as token ids."""

    probe: str
    prefix: list[int]  # before the plant: BOS, and for `order` the question asked first
    plant: list[int]
    question: list[int]  # ends with the cue; the answer's tokens follow it
    key: str
    answer: str
    value_kind: str
    stale: str | None = None  # `update`: the superseded value
    # The messages of prefix + plant after the BOS as (role, text, token count), so recall
    # refresh can treat them as transcript turns; and the question as the user typed it.
    said: tuple[tuple[str, str, int], ...] = ()
    asked: str = ""


def parse_probe(name: str) -> tuple[str, int]:
    """'passkey' -> ('passkey', 1); 'multikey-16' -> ('multikey', 16)."""
    kind, _, n = name.partition("-")
    if kind not in PROBE_KINDS:
        raise ValueError(f"unknown probe {name!r}; expected one of passkey, multikey-N, update, order")
    if kind == "multikey":
        if not n.isdigit() or int(n) < 2:
            raise ValueError(f"multikey needs a count of at least 2, like multikey-16 (got {name!r})")
        return kind, int(n)
    if n:
        raise ValueError(f"probe {kind} takes no count (got {name!r})")
    return kind, 1


def _fact(key: str, value: str) -> str:
    return f"The code for the {key} is {value}."


class PromptBuilder:
    """Renders facts and questions in one prompt style for one tokenizer and template."""

    def __init__(self, tok: Tokenizer, template: AnyTemplate, style: str) -> None:
        if style not in STYLES:
            raise ValueError(f"unknown prompt style {style!r}; expected completion or chat")
        self.tok, self.template, self.style = tok, template, style
        self.bos = template.bos_ids(tok)  # empty for a tokenizer without a BOS token: the stream starts bare

    def statement(self, body: str) -> list[int]:
        return [i for _, _, ids in self.messages(body) for i in ids]

    def messages(self, body: str) -> list[tuple[str, str, list[int]]]:
        """`statement(body)` as the messages it is made of: (role, text, token ids)."""
        if self.style == "chat":
            return [("user", body, self.template.message(self.tok, "user", body)),
                    ("assistant", "Noted.", self.template.message(self.tok, "assistant", "Noted."))]
        return [("user", body, self.tok.encode(body + "\n"))]

    def question_text(self, key: str) -> str:
        return f"What is the code for the {key}?"

    def question(self, key: str) -> list[int]:
        if self.style == "chat":
            return (self.template.message(self.tok, "user", self.question_text(key))
                    + self.template.reply_prefix(self.tok) + self.tok.encode(f"The code for the {key} is"))
        return self.tok.encode(f"\nQuestion: what is the code for the {key}?\nAnswer: the code for the {key} is")

    def answer_ids(self, value: str) -> list[int]:
        return self.tok.encode(" " + value)


def build_sample(probe: str, rng: random.Random, prompts: PromptBuilder, trial: int) -> Sample:
    """The sample of `probe` for one trial, drawn from `rng` (the stream's seed).

    `said` lists the pieces of prefix + plant after the BOS, in order, as transcript turns
    (recall refresh picks among them); their token counts add up to that stream."""
    kind, n = parse_probe(probe)
    said: list[tuple[str, str, int]] = []

    def state(body: str) -> list[int]:
        ids: list[int] = []
        for role, text_, m in prompts.messages(body):
            said.append((role, text_, len(m)))
            ids += m
        return ids

    if kind in ("passkey", "order"):
        vkind = text.VALUE_KINDS[trial % len(text.VALUE_KINDS)]
        key, value = text.make_key(rng), text.make_value(rng, vkind)
        first = state(f"Later I will ask for the code for the {key}; watch for it.") if kind == "order" else []
        plant = state(_fact(key, value))
        return Sample(probe, prompts.bos + first, plant, prompts.question(key), key, value, vkind,
                      said=tuple(said), asked=prompts.question_text(key))
    if kind == "multikey":
        keys = text.distinct_keys(rng, n)
        values = [text.make_value(rng, "digits") for _ in keys]
        i = rng.randrange(n)
        plant = state(" ".join(_fact(k, v) for k, v in zip(keys, values)))
        return Sample(probe, list(prompts.bos), plant, prompts.question(keys[i]), keys[i], values[i], "digits",
                      said=tuple(said), asked=prompts.question_text(keys[i]))
    key = text.make_key(rng)
    old = text.make_value(rng, "digits")
    new = old
    while new == old:
        new = text.make_value(rng, "digits")
    plant = state(_fact(key, old))
    between = f"{text.sentence(rng)} {text.sentence(rng)}\n"
    middle = prompts.tok.encode(between)
    said.append(("user", between.strip(), len(middle)))
    plant += middle + state(f"Update: the code for the {key} is now {new}.")
    return Sample(probe, list(prompts.bos), plant, prompts.question(key), key, new, "digits", stale=old,
                  said=tuple(said), asked=prompts.question_text(key))


def candidates(sample: Sample, rng: random.Random, prompts: PromptBuilder, n: int = N_CANDIDATES) -> list[str]:
    """`n` values of the answer's token length: the answer, the stale value (update) and
    seeded distractors of the same kind, in a seeded order. Fewer when a tokenizer makes
    same-length distractors rare (the chance level follows the real count)."""
    want = len(prompts.answer_ids(sample.answer))
    out = [sample.answer] + ([sample.stale] if sample.stale else [])
    seen = set(out)
    for _ in range(200 * n):
        if len(out) >= n:
            break
        v = text.make_value(rng, sample.value_kind)
        if v not in seen and len(prompts.answer_ids(v)) == want:
            seen.add(v)
            out.append(v)
    rng.shuffle(out)
    return out


def shaped_candidates(answer: str, rng: random.Random, encode: Callable[[str], list[int]], n: int = N_CANDIDATES) -> list[str]:
    """Distractors for a user's own expected answer: same shape and token length."""
    want = len(encode(answer))
    out, seen = [answer], {answer}
    for _ in range(200 * n):
        if len(out) >= n:
            break
        v = text.same_shape(rng, answer)
        if v not in seen and len(encode(v)) == want:
            seen.add(v)
            out.append(v)
    rng.shuffle(out)
    return out
