"""Which combine mode for the window hybrid's GLA branch: a measurement (issue 26).

    python -m recipes.smollm2_hybrid.measure.combine --gguf SmolLM2-135M-Instruct.Q4_1.gguf

Both modes start as (almost) the window-only teacher, so they can only be told apart after
the branch has learned something. This runs LoLCATs' first stage, attention transfer, for
each mode on the same data and budget: with the teacher frozen, every layer's branch
(feature maps, decay, beta or gate) is trained so that the hybrid layer's attention output
matches the teacher's full attention on the teacher's own inputs to that layer (MSE over
the positions past S + W, the only ones that differ). Layers are independent, so the
window's part is computed once and only the branch is differentiated. Reported: the
held-out MSE relative to the window alone's as training goes, then the whole hybrid's
perplexity at --tokens on held-out text of both kinds. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from agent.importers.gguf_source import read_gguf
from agent.importers.llama import HybridOptions
from recipes.smollm2_hybrid.hybrid import build
from recipes.smollm2_hybrid.measure.perplexity import whole_and_tail
from recipes.smollm2_hybrid.text import TEXTS
from recipes.smollm2_hybrid.train.attention import layer_cache, layer_inputs, window_errors


@torch.no_grad()
def held_relative_mse(model: torch.nn.Module, seq: list[dict], start: int) -> float:
    """MSE to full attention on a held-out sequence, relative to the window alone's (1.0:
    the branch adds nothing; 0: the layer is full attention)."""
    errors = [window_errors(b.attn, c, start) for b, c in zip(model.blocks, seq)]
    # Summed over the layers before the ratio (the figures in agent/importers/llama.py were
    # taken so); the training run's logs average the per-layer ratios instead.
    return round(float(sum(e for e, _ in errors) / sum(b for _, b in errors)), 4)


def transfer(model: torch.nn.Module, caches: list[list[dict]], held: list[dict], steps: int, lr: float, mix_lr: float,
             start: int) -> list[tuple[int, float]]:
    """Adam on every branch parameter; returns (step, held-out relative MSE) every 50 steps."""
    mix = [p for n, p in model.named_parameters() if n.endswith(("log_beta", "gate"))]
    rest = [p for n, p in model.named_parameters() if ".gla_branch." in n and not n.endswith(("log_beta", "gate"))]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in mix + rest:
        p.requires_grad_(True)
    opt = torch.optim.Adam([{"params": rest, "lr": lr}, {"params": mix, "lr": mix_lr}])
    curve = [(0, held_relative_mse(model, held, start))]
    for step in range(steps):
        seq = caches[step % len(caches)]
        opt.zero_grad()
        loss = sum(window_errors(b.attn, cache, start)[0] for b, cache in zip(model.blocks, seq)) / len(seq)
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0 or step == steps - 1:
            curve.append((step + 1, held_relative_mse(model, held, start)))
            print(f"  step {step + 1} train mse {float(loss.detach()):.6f} held-out relative mse {curve[-1][1]}", flush=True)
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--train-tokens", type=int, default=1024, help="length of each training sequence")
    ap.add_argument("--train-seqs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--chunk", type=int, default=128, help="GLA chunk (fewer chunks: a cheaper backward on the CPU)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--mix-lr", type=float, default=5e-2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    g = read_gguf(args.gguf)
    T, Tt = args.tokens, args.train_tokens
    ref_ids = torch.tensor(g.tokenizer.encode(TEXTS["reference"](6 * (T + Tt * args.train_seqs) + 6 * Tt)))
    held = {"reference": ref_ids[:T], "docstrings": torch.tensor(g.tokenizer.encode(TEXTS["docstrings"](6 * T))[:T])}
    train = [ref_ids[T + Tt * (i + 1): T + Tt * (i + 2)] for i in range(args.train_seqs)]  # after the held-out part, a gap between
    assert all(len(x) == T for x in held.values()) and all(len(x) == Tt for x in train), "not enough text"
    teacher = build(g, HybridOptions(window=max(T, Tt), sinks=args.sinks, gla_branch=False))
    out: dict = {"tokens": T, "window": args.window, "sinks": args.sinks, "train_tokens": Tt * args.train_seqs, "steps": args.steps,
                 "ppl": {"full": {k: round(whole_and_tail(teacher, v, T // 2)[0], 3) for k, v in held.items()}}}
    inputs = [layer_inputs(teacher, ids) for ids in train]
    held_inputs = layer_inputs(teacher, held["reference"][:Tt])
    del teacher
    base = build(g, HybridOptions(window=args.window, sinks=args.sinks, gla_branch=False))
    out["ppl"]["window"] = {k: round(whole_and_tail(base, v, T // 2)[0], 3) for k, v in held.items()}
    print(out["ppl"], flush=True)
    for mode in ("softmax", "gated"):
        model = build(g, HybridOptions(window=args.window, sinks=args.sinks, combine=mode, chunk_size=args.chunk))
        caches = [[layer_cache(b.attn, h) for b, h in zip(model.blocks, seq)] for seq in inputs]
        held_cache = [layer_cache(b.attn, h) for b, h in zip(model.blocks, held_inputs)]
        t = time.time()
        out[f"held_relative_mse_{mode}"] = transfer(model, caches, held_cache, args.steps, args.lr, args.mix_lr, args.sinks + args.window)
        out[f"seconds_{mode}"] = round(time.time() - t)
        model.eval()
        out["ppl"][mode] = {k: round(whole_and_tail(model, v, T // 2)[0], 3) for k, v in held.items()}
        mixes = [b.attn.gla_branch.mix.detach() for b in model.blocks]
        out[f"mix_{mode}"] = {"mean": round(float(torch.stack(mixes).mean()), 4), "layer0": [round(x, 3) for x in mixes[0].tolist()]}
        print(mode, out["ppl"][mode], flush=True)
        del caches, model
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
