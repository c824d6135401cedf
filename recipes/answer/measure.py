"""What the model does when asked for a detail from the conversation: `laplace probe
natural`'s own conversations (held-out concepts, phrasings and values), every reply kept
and sorted into answered / says not told / deflects / other.

    python -m recipes.answer.measure -m MODEL_DIR [--delta DELTA] [--distance 0] [--trials 26] [--set probe|heldout2] [--out r.json]

The trials are exactly those of `laplace probe natural --distances D --trials N --seed 0
--refresh off`, so its recall and "not told" columns are reproduced here; this adds the
split of the wrong replies, which the probe lumps together. `--set heldout2` runs the same
conversations over the second held-out set (recipes/answer/heldout2.py) instead of the probe's
concepts and values. Each row carries `back`, the tokens from the statement asked about to
the end of the question, and the summary's `inside_window` is recall over the rows whose
`back` is at most the window: at 200 tokens of chat, some trials' details have left it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from contextlib import contextmanager
from typing import Iterator
from unittest import mock
from pathlib import Path

import torch

from agent.probes import natural
from agent.probes.natural import _ask, _read, build_conversation, plan, score_absent, score_stated
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.delta import DeltaError, apply_delta, read_delta
from agent.runtime.modeldir import ModelLoadError
from agent.probes.natural_text import make_value, mentions
from recipes.answer.heldout2 import HELDOUT2_CONCEPTS, HELDOUT2_VALUES

# A reply that declines or talks about itself instead of using the conversation.
DEFLECT = re.compile(r"\b(as an? (ai|chatbot|language model)|i('m| am) (an ai|a chatbot|not able|unable|not equipped|sorry)|"
                     r"i (can(no|')t|do not have|don'?t have) (access|the ability|personal|information)|not sure)", re.I)


@contextmanager
def concept_set(name: str) -> Iterator[None]:
    """The probe's own conversation builder over another set of concepts and values."""
    if name == "probe":
        yield
        return
    with mock.patch.object(natural, "CONCEPTS", HELDOUT2_CONCEPTS), \
            mock.patch.object(natural, "make_value", lambda rng, kind, pools=HELDOUT2_VALUES: make_value(rng, kind, pools)):
        yield


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A missing or unreadable model directory or delta exits with one line naming it."""
    try:
        yield
    except (ModelLoadError, DeltaError, OSError) as e:
        raise SystemExit(f"error: {e}") from None


def load_tuned(model: str, delta: str | None, device: str = "cpu"):  # type: ignore[no-untyped-def]
    """The model directory with the delta applied (`one_line_errors`)."""
    with one_line_errors():
        lm = load_model_dir(model, device=device)
        if delta:
            apply_delta(lm.model, *read_delta(delta))
    return lm


def _horizon(lm) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(recall horizon, block budget) as `laplace probe natural --refresh on` uses them."""
    from agent.recall.horizon import recall_horizon
    from agent.recall.rule import DEFAULT_BUDGET

    return recall_horizon(lm)[0], DEFAULT_BUDGET


def kind(reply: str, verdict: str) -> str:
    if verdict in ("recalled", "not_told", "refused"):
        return verdict
    return "deflects" if DEFLECT.search(reply) else verdict


def back(lm, c: natural.Conversation) -> int:  # type: ignore[no-untyped-def]
    """Tokens from the first token of the statement asked about to the end of the question:
    at most the window's size means the whole statement is inside the window when the
    answer starts (the assistant header's few tokens aside)."""
    start = len(lm.template.message(lm.tokenizer, "system", "", first=True))
    for role, body, n in c.said:
        if role == "user" and mentions(body, c.value):
            break
        start += n
    else:
        raise ValueError(f"no statement of {c.value!r} in the trial's turns")
    return len(c.ids) + len(lm.template.message(lm.tokenizer, "user", c.question)) - start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--delta")
    ap.add_argument("--distance", type=int, default=0)
    ap.add_argument("--trials", type=int, default=26)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", choices=("probe", "heldout2"), default="probe")
    ap.add_argument("--refresh", choices=("off", "on"), default="off", help="on: the recall block chat would fold is read first")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the model runs (float32 either way)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    lm = load_tuned(a.model, a.delta, a.device)
    with concept_set(a.set):
        convs = [build_conversation(lm, c, a.seed, a.distance, t) for t, c in enumerate(plan(a.seed, a.distance, a.trials))]
        replies, _, _ = _ask(lm, _read(lm, convs), convs, _horizon(lm) if a.refresh == "on" else None)
    window = getattr(lm.model.config, "window", 0)
    rows = []
    for c, (stated, absent) in zip(convs, replies):
        rows.append({"concept": c.concept.name, "value": c.value, "question": c.question, "reply": stated,
                     "kind": kind(stated, score_stated(stated, c.value)), "back": back(lm, c),
                     "absent_question": c.absent_question, "absent_reply": absent, "absent_kind": kind(absent, score_absent(absent))})
    n = len(rows)
    stated_counts = Counter(r["kind"] for r in rows)
    absent_counts = Counter(r["absent_kind"] for r in rows)
    summary = {"model": a.model, "delta": a.delta, "set": a.set, "refresh": a.refresh, "distance": a.distance, "trials": n,
               "stated": {k: v / n for k, v in sorted(stated_counts.items())},
               "never_stated": {k: v / n for k, v in sorted(absent_counts.items())}}
    if window:  # the floor "inside the window" is read off these rows only
        inside = [r for r in rows if r["back"] <= window]
        summary["inside_window"] = {"window": window, "trials": len(inside),
                                    "recalled": sum(r["kind"] == "recalled" for r in inside) / max(len(inside), 1)}
    if a.out:
        a.out.write_text(json.dumps({**summary, "rows": rows}, indent=2), encoding="utf-8")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
