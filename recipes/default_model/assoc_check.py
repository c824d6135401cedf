"""Can the model learn to copy an arbitrary token bound to a key? A toy associative-recall
drill (multi-query associative recall) on the default model's architecture.

    python -m recipes.default_model.assoc_check --from default|scratch [--minutes M]

Each row is P key/value pairs of single tokens (keys from one id range, values from
another) followed by the same keys in a new order; the loss and the accuracy are on the
value after each repeated key, so the only way to score is to copy the value bound to it.
It trains a copy of the bundled model (`default`) or the same architecture from a random
init (`scratch`) for `--minutes` and prints held-out accuracy every 100 steps. Phase 6 left
the model copying no word said in plain speech; this separates "cannot bind and copy
tokens" from "has not been taught to for words" (docs/recipe-experiments.md, Phase 6).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from agent.runtime.checkpoint import load_model_dir
from agent.runtime.model import build_model
from recipes.default_model.plan import MODEL

DEFAULT = Path(__file__).resolve().parents[2] / "agent" / "models" / "default"
KEYS, VALUES = (100, 1500), (1600, 3000)  # token id ranges, disjoint


def batch(g: torch.Generator, rows: int, pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` sequences of `pairs` (key, value) tokens then the keys again, shuffled; the
    labels hold each queried key's value at the key's position, -100 elsewhere."""
    k = torch.stack([torch.randperm(KEYS[1] - KEYS[0], generator=g)[:pairs] + KEYS[0] for _ in range(rows)])
    v = torch.randint(*VALUES, (rows, pairs), generator=g)
    order = torch.stack([torch.randperm(pairs, generator=g) for _ in range(rows)])
    x = torch.cat([torch.stack([k, v], -1).flatten(1), torch.stack([k.gather(1, order), v.gather(1, order)], -1).flatten(1)], 1)
    y = torch.full_like(x, -100)
    y[:, 2 * pairs::2] = x[:, 2 * pairs + 1::2]
    return x, y


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        pred = model(x, None)[0].argmax(-1)
    m = y != -100
    return (pred[m] == y[m]).float().mean().item()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="init", choices=("default", "scratch"), required=True)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: only --minutes)")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = load_model_dir(DEFAULT).model if args.init == "default" else build_model(MODEL, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    train, held = torch.Generator().manual_seed(1), batch(torch.Generator().manual_seed(2), args.rows, args.pairs)
    t0, step = time.time(), 0
    print(f"{args.init} step 0 accuracy {accuracy(model, *held):.3f}", flush=True)
    while time.time() - t0 < args.minutes * 60 and (not args.steps or step < args.steps):
        x, y = batch(train, args.rows, args.pairs)
        loss = F.cross_entropy(model(x, None)[0].flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 100 == 0 or step == args.steps:
            print(f"{args.init} step {step} loss {loss.item():.3f} accuracy {accuracy(model, *held):.3f} ({time.time() - t0:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
