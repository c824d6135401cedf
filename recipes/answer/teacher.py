"""The base model's own replies to everyday requests, to mix into the answer dialogues so
the delta keeps answering requests as the base does (self-distillation as an anchor).

    python -m recipes.answer.teacher -m MODEL_DIR --out replies.jsonl [--set anchors] [--batch 8] [--limit N]

`--set anchors` (default) answers `requests.ANCHOR_REQUESTS` (~400, the social turns last); `--set heldout` the 64
`requests.HELDOUT_REQUESTS`, whose replies are the "teacher-reply loss" of the general-chat
check (recipes/answer/check.py) and never training data. Up to S + W tokens the default
hybrid is the teacher exactly, so its replies to these short prompts are SmolLM2's own.

Resumable and batched: requests already in `--out` (answered or dropped) are skipped, each
batch of `--batch` requests is appended and flushed as it finishes, and `--limit N` stops
after N new requests; rerun the same command to continue. Greedy, at most `REPLY_TOKENS`
tokens; a reply cut before its end is trimmed to its last full sentence, and a reply that
repeats a sentence, a line or a run of words (greedy decoding's loops) or is too short is dropped (recorded with
`"reply": null`, so it is not retried), so the model is never taught to loop or to stop
mid-thought.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch

from agent.probes.engine import greedy_rows
from recipes.answer.measure import load_tuned
from recipes.answer.requests import ANCHOR_REQUESTS, HELDOUT_REQUESTS

REPLY_TOKENS = 128
REQUESTS = ANCHOR_REQUESTS  # the anchors' requests (none of check.py's held-out ones; a test checks it)
SETS = {"anchors": ANCHOR_REQUESTS, "heldout": HELDOUT_REQUESTS}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _trim(text: str) -> str | None:
    """The reply up to its last full sentence, or None if that leaves too little."""
    m = list(re.finditer(r"[.!?](\s|$)", text))
    if not m:
        return None
    out = text[: m[-1].end()].strip()
    return out if len(out) >= 20 else None


def clean(text: str, ended: bool) -> str | None:
    """The reply to keep, or None: trimmed when cut off, dropped when it loops."""
    reply = text.strip() if ended and text.strip() else _trim(text)
    if reply is None:
        return None
    sentences = [s.strip().lower() for s in _SENTENCE.split(reply) if len(s.strip()) > 10]
    if len(sentences) != len(set(sentences)) or loops(reply):
        return None
    return reply


def loops(text: str) -> bool:
    """A greedy loop: a line said three times ("- A ruler"), or a run of five words three times."""
    lines = Counter(x.strip().lower() for x in text.splitlines() if len(x.strip()) > 3)
    words = re.findall(r"[a-z0-9']+", text.lower())
    grams = Counter(tuple(words[i : i + 5]) for i in range(len(words) - 4))
    return any(n >= 3 for n in lines.values()) or any(n >= 3 for n in grams.values())


def done_requests(path: Path) -> set[str]:
    """Requests already answered (or dropped) in `path`: a rerun skips them."""
    if not path.is_file():
        return set()
    return {json.loads(x)["request"] for x in path.read_text(encoding="utf-8").splitlines() if x.strip()}


@torch.inference_mode()
def answer(lm, requests: Sequence[str]) -> list[str | None]:  # type: ignore[no-untyped-def]
    """Greedy replies to `requests` in one batch, each a fresh chat (empty system turn)."""
    tok, t = lm.tokenizer, lm.template
    prompts = [t.message(tok, "system", "", first=True) + t.message(tok, "user", r) + t.reply_prefix(tok) for r in requests]
    model = lm.model.eval()
    stops = list(t.stop_ids(tok))
    outs = greedy_rows(model, model.new_state(len(prompts)), prompts, REPLY_TOKENS, stops)
    replies = []
    for ids in outs:
        ended = len(ids) < REPLY_TOKENS or bool(ids and ids[-1] in stops)
        replies.append(clean(tok.decode([i for i in ids if i not in stops]), ended))
    return replies


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", choices=sorted(SETS), default="anchors")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--limit", type=int, help="stop after this many new requests (rerun to continue)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the model runs (float32 either way)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    todo = [r for r in SETS[a.set] if r not in done_requests(a.out)]
    if a.limit is not None:
        todo = todo[: a.limit]
    if not todo:
        print(f"all {len(SETS[a.set])} requests of --set {a.set} are in {a.out}")
        return
    lm = load_tuned(a.model, None, a.device)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    t0 = time.perf_counter()
    for i in range(0, len(todo), a.batch):
        batch = todo[i : i + a.batch]
        replies = answer(lm, batch)
        with a.out.open("a", encoding="utf-8") as f:
            for req, reply in zip(batch, replies):
                f.write(json.dumps({"request": req, "reply": reply}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        kept += sum(r is not None for r in replies)
        n = i + len(batch)
        print(f"{n}/{len(todo)} requests, {kept} replies kept, {(time.perf_counter() - t0) / n:.1f} s a request", flush=True)
    print(f"{kept} of {len(todo)} new replies kept in {a.out}")


if __name__ == "__main__":
    main()
