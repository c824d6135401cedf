"""How far a stored state is from a replay of its transcript, and how far one wrong or
missing token moves it: the measurement behind `agent.runtime.state_compare.ROW_TOLERANCE`.

    python -m recipes.experiments.verify_tolerance --mixer gla|ssd|window --tokens 1024 [--layers L]
    python -m recipes.experiments.verify_tolerance --model default --tokens 1024

A session's stored state is built the way chat builds it: each turn's prompt is prefilled,
its reply decoded one token at a time with `step_`. `laplace sessions verify --replay` folds
each whole turn with `prefill` instead. This runs both over the same ids (turns of
`--prompt` prefilled and `--reply` stepped tokens) and prints, per state part, the largest
relative row difference (`state_compare.compare`) and the largest elementwise difference;
then the same against replays of transcripts with one token changed (1 and 100 tokens
before the end, and half way) or one token missing (100 before the end).

Measured (all under load on the shared 2-core machine; the numbers, not the seconds, count):
see the table in `agent/runtime/state_compare.py` beside ROW_TOLERANCE; the rows printed
are kept in verify_tolerance_rows.jsonl (gla, ssd, window at 1,024 and 4,096 tokens, then
the default model at 1,024).

Random models (`--mixer`) are built at realistic widths (gla: laplace-125m's; ssd: the same
widths on the Mamba-2 mixer; window: SmolLM2-135M's hybrid, all 30 layers) with a 4,096
vocabulary, since the head does not touch the state. Prints one JSON object per case.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from agent.runtime.config import PRESETS
from agent.runtime.generation import EagerRunner
from agent.runtime.model import build_model
from agent.runtime.state_compare import compare


def random_model(mixer: str, layers: int | None):  # type: ignore[no-untyped-def]
    base = {"gla": PRESETS["laplace-125m"], "window": PRESETS["smollm2-135m-window"]}.get(mixer)
    if mixer == "ssd":
        base = dataclasses.replace(PRESETS["ssd-1b"], name="ssd-768", d_model=768, n_layers=12, n_heads=12, ffn_dim=2048)
    config = dataclasses.replace(base, vocab_size=4096, **({"n_layers": layers} if layers else {}))
    return build_model(config, seed=0).eval(), config


def turns_of(ids: list[int], prompt: int, reply: int) -> list[tuple[list[int], list[int]]]:
    out, i = [], 0
    while i < len(ids):
        out.append((ids[i:i + prompt], ids[i + prompt:i + prompt + reply]))
        i += prompt + reply
    return out


@torch.inference_mode()
def stored_path(runner: EagerRunner, model, turns):  # type: ignore[no-untyped-def]
    """Chat's way: each prompt prefilled, each reply token stepped."""
    state = model.new_state(1)
    for p, r in turns:
        _, state = runner.prefill(p, state)
        for t in r:
            runner.step_(torch.tensor([t]), state)
    return state


@torch.inference_mode()
def replay_path(runner: EagerRunner, model, turns, state=None, start: int = 0):  # type: ignore[no-untyped-def]
    """verify's way: each whole turn prefilled (from turn `start`, into `state`)."""
    state = state if state is not None else model.new_state(1)
    for p, r in turns[start:]:
        _, state = runner.prefill(p + r, state)
    return state


def summary(stored, replayed) -> dict:  # type: ignore[no-untyped-def]
    return {d.name: {"row": float(f"{d.worst:.3g}"), "at": list(d.where), "abs": float(f"{d.max_abs:.3g}")}
            for d in compare(stored, replayed)}


def corrupted(ids: list[int], at: int, vocab: int, missing: bool) -> list[int]:
    out = list(ids)
    if missing:
        del out[at]
    else:
        out[at] = (out[at] + 1 + random.Random(at).randrange(vocab - 1)) % vocab
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixer", choices=("gla", "ssd", "window"))
    ap.add_argument("--model", help="a model name or directory instead of a random model")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--prompt", type=int, default=112)
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--no-corrupt", action="store_true")
    args = ap.parse_args()
    if not (args.mixer or args.model):
        ap.error("give --mixer gla|ssd|window or --model NAME")
    t0 = time.perf_counter()
    if args.model:
        from agent.runtime.checkpoint import load_model

        lm = load_model(args.model)
        model, config, label = lm.model, lm.config, args.model
        # Ordinary English and code: this package's own sources, as many as the length needs.
        text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(Path(__file__).parents[2].glob("agent/*/*.py")))
        ids = lm.tokenizer.encode(text)[: args.tokens]
    else:
        model, config = random_model(args.mixer, args.layers)
        label = args.mixer
        rng = random.Random(1)
        ids = [rng.randrange(config.vocab_size) for _ in range(args.tokens)]
    runner = EagerRunner(model)
    turns = turns_of(ids, args.prompt, args.reply)
    stored = stored_path(runner, model, turns)
    # The clean replay, keeping the state at the turn before the last 300 tokens and half way,
    # so corrupted replays only fold from there.
    n_turn = args.prompt + args.reply
    late = max(0, (len(ids) - 300) // n_turn)
    half = (len(ids) // 2) // n_turn
    at_half = replay_path(runner, model, turns[:half])
    at_late = replay_path(runner, model, turns[half:late], at_half.clone())
    clean = replay_path(runner, model, turns[late:], at_late.clone())
    row = {"case": label, "mixer": config.mixer, "layers": config.n_layers, "d_model": config.d_model,
           "tokens": len(ids), "stepped": sum(len(r) for _, r in turns), "clean": summary(stored, clean)}
    if not args.no_corrupt:
        cases = {"wrong@-1": (len(ids) - 1, False), "wrong@-100": (len(ids) - 100, False),
                 "missing@-100": (len(ids) - 100, True), "wrong@half": (half * n_turn + 5, False)}
        for name, (at, missing) in cases.items():
            bad = turns_of(corrupted(ids, at, config.vocab_size, missing), args.prompt, args.reply)
            start, base = (half, at_half) if name.endswith("half") else (late, at_late)
            row[name] = summary(stored, replay_path(runner, model, bad, base.clone(), start))
    row["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
