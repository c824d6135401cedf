"""Can the model learn to copy an arbitrary token bound to a key? A toy associative-recall
drill (multi-query associative recall) on the demo model's architecture.

    python -m recipes.experiments.assoc_check --from default|scratch|DIR [--minutes M]
    python -m recipes.experiments.assoc_check --from DIR --natural-rows 4 --save OUT [--drill repeat]

Each row is P key/value pairs of single tokens (keys from one id range, values from
another) followed by the same keys in a new order; the loss and the accuracy are on the
value after each repeated key, so the only way to score is to copy the value bound to it.
It trains a copy of the bundled model (`default`), the same architecture from a random
init (`scratch`) or a model directory, for `--minutes` (or `--steps`), and prints the
held-out accuracy on this drill every 100 steps (whichever drill it trains on). Phase 6 left the model copying no word said in plain speech;
this separates "cannot bind and copy tokens" from "has not been taught to for words".

With `--natural-rows N` each step also trains N rows of phase 6's second block (plain
speech, phase6.WIDE512), so the drill runs beside the chat it should help, and `--save` keeps
the model for natural_check. `--drill repeat` swaps the drill for 24 random tokens said
twice, the loss on the second time (plain induction). Both were measured not to carry over
to plain speech (docs/recipe-experiments.md, Phase 6).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from agent.runtime.checkpoint import LoadedModel, load_model_dir, resolve_model_path, save_model_dir
from agent.runtime.model import build_model
from agent.train.data import PackedData, load_documents, pack, pad_token
from recipes.demo_model import data as rdata
from recipes.demo_model.corpus import read_passages, split_passages
from recipes.experiments.natural import NaturalBuilder
from recipes.demo_model.plan import MODEL
from recipes.experiments.phase6 import WIDE512
from recipes.demo_model.vocab import TRAIN

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


def repeats(g: torch.Generator, rows: int, length: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` sequences of `length` random tokens said twice; the labels are the second
    saying's tokens (from its second on: its first follows nothing seen before)."""
    half = torch.randint(KEYS[0], VALUES[1], (rows, length), generator=g)
    x = torch.cat([half, half], 1)
    y = torch.full_like(x, -100)
    y[:, length:-1] = x[:, length + 1:]
    return x, y


def natural_rows(lm: LoadedModel, folder: Path, n: int) -> PackedData:
    """`n` rows of 512 tokens of phase 6's second block, written into `folder` once."""
    path = folder / "natural.jsonl"
    if not path.exists():
        builder = NaturalBuilder(rdata.make_builder(TRAIN, split_passages(read_passages())[0], lm.tokenizer, lm.template))
        rdata.write_dialogues(path, builder, random.Random(77), WIDE512, n, lm.tokenizer, lm.template)
    docs, _ = load_documents([path], lm.tokenizer, lm.template)
    return pack(docs, WIDE512.length, pad_token(lm.tokenizer))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        pred = model(x, None)[0].argmax(-1)
    m = y != -100
    return (pred[m] == y[m]).float().mean().item()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="init", required=True, help="demo, scratch, or a model directory")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: only --minutes)")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--rows", type=int, default=64, help="drill rows a step")
    ap.add_argument("--drill", choices=("assoc", "repeat"), default="assoc")
    ap.add_argument("--natural-rows", type=int, default=0, help="plain-speech rows of 512 tokens a step beside the drill")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--save", default=None, metavar="DIR", help="write the trained model here")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.natural_rows and not args.steps:
        ap.error("--natural-rows needs --steps (the plain-speech rows are written for that many steps)")
    if args.init == "scratch" and (args.save or args.natural_rows):
        ap.error("--save and --natural-rows need a trained model's tokenizer: --from demo or DIR")
    if args.natural_rows and not args.save:
        ap.error("--natural-rows needs --save DIR (its rows are written there)")
    path = None if args.init == "scratch" else resolve_model_path(args.init)  # "demo": the packaged demo model
    if args.init != "scratch" and (path is None or not (path / "config.json").is_file()):
        ap.error(f"--from {args.init}: not a model directory (no config.json); give demo, scratch or a model directory")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if path is None:
        lm = None
        model = build_model(MODEL, seed=0)
    else:
        lm = load_model_dir(path)
        model = lm.model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    make = (lambda g: batch(g, args.rows, args.pairs)) if args.drill == "assoc" else (lambda g: repeats(g, args.rows))
    train, held = torch.Generator().manual_seed(1), batch(torch.Generator().manual_seed(2), 64, args.pairs)
    chat = None
    if lm is not None and args.natural_rows:
        chat = natural_rows(lm, Path(args.save), args.steps * args.natural_rows + 50)
        order = torch.randperm(len(chat), generator=torch.Generator().manual_seed(3))
    t0, step = time.time(), 0
    print(f"{args.init} step 0 accuracy {accuracy(model, *held):.3f}", flush=True)
    while time.time() - t0 < args.minutes * 60 and (not args.steps or step < args.steps):
        x, y = make(train)
        loss = F.cross_entropy(model(x, None)[0].flatten(0, 1), y.flatten(), ignore_index=-100)
        if chat is not None:
            nx, ny = chat.rows(order[(step * args.natural_rows) % len(chat):][:args.natural_rows])
            loss = loss + F.cross_entropy(model(nx, None)[0].flatten(0, 1), ny.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 100 == 0 or step == args.steps:
            print(f"{args.init} step {step} loss {loss.item():.3f} accuracy {accuracy(model, *held):.3f} ({time.time() - t0:.0f} s)",
                  flush=True)
    if lm is not None and args.save:
        save_model_dir(lm, Path(args.save) / "model", card=lm.card)
        print(f"wrote {Path(args.save) / 'model'}")


if __name__ == "__main__":
    main()
