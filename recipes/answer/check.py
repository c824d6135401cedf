"""Does the answer delta leave general chat alone? Loss on plain text and on the base
model's own chat replies, before and after the delta, and both models' replies side by side.

    python -m recipes.answer.check -m MODEL_DIR (--delta DELTA | --tuned MODEL_DIR) [--out report.json]

Plain text: the standard library's docstrings (recipes/smollm2_hybrid/text.py), 1,024 tokens.
A second plain text, far from Python's documentation: the first 1,024 tokens of the GPL-3
(`/usr/share/common-licenses/GPL-3`, where the machine has it), as `license_ppl`.
Over-refused: the share of those replies that say "you haven't told me" to a plain request.
Invented: the share of replies to `PROMPTS`, each asked in a fresh chat, that claim the user
said or told something (`requests.claims_user_said`): with nothing said before, every such
claim is made up (issue 36's floor: at most 2%).
Social: the same two scores, apart, over `requests.HELDOUT_SOCIAL` (32 greetings, thanks,
goodbyes, questions about the assistant, a word about the user's mood; held out like
`PROMPTS`), where "What's your name?" answered "You haven't told me your name" is as wrong
as an invented "you said".
Chat: `PROMPTS` (none of them in the training dialogues) answered greedily by the base
model; the loss of those same replies under the tuned model says how far it drifted from
the base model's own words (the base's loss on its greedy replies is low by construction,
so compare the two numbers as a drift, not as quality).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agent.probes.engine import greedy_rows
from agent.probes.natural_text import says_not_told
from agent.runtime.checkpoint import LoadedModel, load_model_dir
from agent.runtime.delta import apply_delta, read_delta
from recipes.answer.measure import one_line_errors
from recipes.answer.requests import HELDOUT_REQUESTS, HELDOUT_SOCIAL, claims_user_said
from recipes.smollm2_hybrid.text import stdlib_text

PROMPTS = HELDOUT_REQUESTS  # 64 everyday requests, never anchors (recipes/answer/requests.py)
REPLY_TOKENS = 64
TEXT_TOKENS = 1024


def _prefix(lm: LoadedModel, prompt: str) -> list[int]:
    tok, t = lm.tokenizer, lm.template
    return t.message(tok, "system", "", first=True) + t.message(tok, "user", prompt) + t.reply_prefix(tok)


@torch.inference_mode()
def replies(lm: LoadedModel, requests: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    model = lm.model.eval()
    prompts = [_prefix(lm, p) for p in requests]
    return greedy_rows(model, model.new_state(len(prompts)), prompts, REPLY_TOKENS, lm.template.stop_ids(lm.tokenizer))


@torch.inference_mode()
def nll(lm: LoadedModel, context: list[int], target: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of `target` after `context`, and its token count."""
    ids = torch.tensor([context + target], device=lm.model.embed.weight.device)
    logits, _ = lm.model(ids[:, :-1], lm.model.new_state(1))
    tail = logits[0, len(context) - 1 :].float()
    return float(F.cross_entropy(tail, ids[0, len(context) :], reduction="sum")), len(target)


def license_text() -> str | None:
    """A second plain text, far from Python's documentation (run 3 trains on the language
    reference's prose): the GPL-3 as Debian ships it, when the machine has it."""
    path = Path("/usr/share/common-licenses/GPL-3")
    return path.read_text(encoding="utf-8") if path.is_file() else None


def text_ppl(lm: LoadedModel, text: list[int]) -> tuple[float, int]:
    bos = lm.template.bos_ids(lm.tokenizer)
    return nll(lm, bos or text[:1], text if bos else text[1:])


def losses(lm: LoadedModel, chats: list[tuple[list[int], list[int]]], text: list[int],
           gpl: list[int] | None = None) -> dict[str, float]:
    tot, n = 0.0, 0
    for ctx, rep in chats:
        s, k = nll(lm, ctx, rep)
        tot, n = tot + s, n + k
    s, k = text_ppl(lm, text)
    out = {"chat_loss": tot / n, "chat_ppl": math.exp(tot / n), "text_loss": s / k, "text_ppl": math.exp(s / k)}
    if gpl:
        s, k = text_ppl(lm, gpl)
        out["license_ppl"] = math.exp(s / k)
    return out


def scored(lm: LoadedModel, requests: tuple[str, ...], base: list[list[int]], tuned: list[list[int]]) -> list[dict[str, Any]]:
    """Both models' replies side by side, each marked invented ("you said ...") or not told."""
    dec = lm.tokenizer.decode
    out = []
    for p, b, t in zip(requests, base, tuned):
        s: dict[str, Any] = {"prompt": p, "base": dec(b), "tuned": dec(t)}
        for who in ("base", "tuned"):
            s[who + "_invented"], s[who + "_not_told"] = claims_user_said(s[who]), says_not_told(s[who])
        out.append(s)
    return out


def shares(samples: list[dict[str, Any]], who: str) -> dict[str, float]:
    """Invented and over-refused ("you haven't told me" to a plain request) as shares of `samples`."""
    return {"invented": sum(s[who + "_invented"] for s in samples) / len(samples),
            "over_refused": sum(s[who + "_not_told"] for s in samples) / len(samples)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True, help="base model directory")
    tuned_arg = ap.add_mutually_exclusive_group(required=True)
    tuned_arg.add_argument("--delta", help="delta safetensors (agent/runtime/delta.py) applied to the base")
    tuned_arg.add_argument("--tuned", help="a tuned model directory (e.g. `laplace finetune --tune all` output)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cpu", help="cpu | cuda: where the models run (float32 either way)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    with one_line_errors():  # before the base's replies, which take minutes
        lm = load_model_dir(a.model, device=a.device)
        delta = read_delta(a.delta) if a.delta else None
        tuned = load_model_dir(a.tuned, device=a.device) if a.tuned else lm
    text = lm.tokenizer.encode(stdlib_text(8000))[:TEXT_TOKENS]
    gpl_text = license_text()
    gpl = lm.tokenizer.encode(gpl_text)[:TEXT_TOKENS] if gpl_text else None
    base_replies, base_social = replies(lm), replies(lm, HELDOUT_SOCIAL)
    chats = [(_prefix(lm, p), r) for p, r in zip(PROMPTS, base_replies) if r]
    before = losses(lm, chats, text, gpl)
    if delta:
        apply_delta(lm.model, *delta)
    after = losses(tuned, chats, text, gpl)
    samples = scored(lm, PROMPTS, base_replies, replies(tuned))
    social_samples = scored(lm, HELDOUT_SOCIAL, base_social, replies(tuned, HELDOUT_SOCIAL))
    social: dict[str, Any] = {"requests": len(HELDOUT_SOCIAL), "before": {}, "after": {}}
    for name, side, who in (("before", before, "base"), ("after", after, "tuned")):
        side.update(shares(samples, who))
        social[name] = shares(social_samples, who)
    report: dict[str, Any] = {"model": a.model, "delta": a.delta, "tuned": a.tuned, "requests": len(PROMPTS), "before": before,
                              "after": after, "social": social, "samples": samples, "social_samples": social_samples}
    if a.out:
        a.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps({"before": before, "after": after, "social": social}, indent=2))
    for s in samples + social_samples:
        flag = "  [invented]" if s["tuned_invented"] else "  [over-refused]" if s["tuned_not_told"] else ""
        print(f"\n> {s['prompt']}\n  base : {s['base']!r}\n  tuned: {s['tuned']!r}{flag}")


if __name__ == "__main__":
    main()
