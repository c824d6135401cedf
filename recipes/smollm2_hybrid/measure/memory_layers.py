"""Which layers the window's memory should live in (issue 37), measured on training text.

    python -m recipes.smollm2_hybrid.measure.memory_layers rank --model DIR --corpus CORPUS --out rank.json
    python -m recipes.smollm2_hybrid.measure.memory_layers ppl --model DIR --corpus CORPUS \
        window=none:0 full=full late=11-29:224 sel13=11,14,15,17,18,20-24,26,28,29:768 --out ppl.json

`rank`: per layer and kv head, on `--docs` training documents of `--tokens` tokens (one per
source, seeded), full attention's queries past S + W: the attention weight they give keys
outside the sinks and the window ("mass"), and how far the window alone's output is from
full attention's, relative to its size ("diff"). Both are means over the queries and the
kv head's query heads.

`ppl`: perplexity past S + W up to 2,048 and to 4,096 tokens on the same documents (the
training split: the layers are chosen here, and the held-out corpus stays for
`memory.py ppl`), for variants NAME=LAYERS:M (LAYERS: all, none, or 11,14-18; M the
slots; M+R: R slots in each other layer, `memory_rest_slots`; the "novelty" policy), NAME=full (full attention), with the share of the window's
gap to full attention each closes.

What it found on the default model (2026-12-04): memory in layers 0-10 closes nothing
(their far attention is diffuse: high mass, nothing a few hundred kept tokens give back),
layers 11-29 carry it all, and within them the memory does best where "diff" is highest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from agent.runtime.checkpoint import LoadedModel, load_model_dir, model_from_tensors
from agent.runtime.layers import rope
from agent.runtime.window import WindowAttention
from recipes.smollm2_hybrid.measure.memory import FULL, variant_model
from recipes.smollm2_hybrid.measure.perplexity import perplexity, token_losses


def train_docs(corpus: Path, encode: Any, tokens: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """One training document of at least `tokens` + 1 tokens per source (seeded pick),
    sources in name order: (doc_id, its first `tokens` + 1 ids)."""
    rng = random.Random(seed)
    by: dict[str, list[dict]] = {}
    with open(corpus / "train.jsonl", encoding="utf-8") as f:
        for d in map(json.loads, f):
            by.setdefault(d["source"], []).append(d)
    picked = []
    for source in sorted(by):
        docs = by[source][:]
        rng.shuffle(docs)
        for d in docs:
            ids = encode(d["text"])
            if len(ids) >= tokens + 1:
                picked.append((d["doc_id"], ids[: tokens + 1]))
                break
    return picked


def parse_layers(text: str, n_layers: int) -> tuple[int, ...]:
    if text == "all":
        return tuple(range(n_layers))
    if text == "none":
        return ()
    from agent.importers.shipped import parse_layers as parse

    return parse(text)


@torch.inference_mode()
def rank(lm: LoadedModel, docs: list[tuple[str, list[int]]], tokens: int) -> dict[str, Any]:
    c = lm.config
    S, W = c.sinks, c.window
    model = variant_model(lm, FULL, tokens).model
    layers = [m for m in model.modules() if isinstance(m, WindowAttention)]
    mass = torch.zeros(c.n_layers, c.kv_heads)
    diff = torch.zeros(c.n_layers, c.kv_heads)

    def hook(mod: WindowAttention, args: tuple[Any, ...]) -> None:
        i = layers.index(mod)
        q, k, v = mod._qkv(args[0])  # [1, T, H or G, D], un-rotated
        T, H, D = q.shape[1], q.shape[2], q.shape[3]
        G = k.shape[2]
        R = H // G
        p = torch.arange(T)
        qr = rope(q.transpose(1, 2), p, c.rope_theta)[:, :, S + W :] * D**-0.5  # queries past S + W
        kr = rope(k.transpose(1, 2), p, c.rope_theta).repeat_interleave(R, 1)
        vv = v.transpose(1, 2).repeat_interleave(R, 1)
        s = (qr @ kr.transpose(-1, -2)).masked_fill(p[None, :] > p[S + W :, None], float("-inf"))
        far = (p[None, :] >= S) & (p[None, :] <= p[S + W :, None] - W)  # left the window, not a sink
        a = s.softmax(-1)
        o_full, o_win = a @ vv, s.masked_fill(far, float("-inf")).softmax(-1) @ vv
        gap = (o_full - o_win).norm(dim=-1) / o_full.norm(dim=-1).clamp_min(1e-6)
        mass[i] += (a * far).sum(-1).reshape(G, R, -1).mean((1, 2))
        diff[i] += gap.reshape(G, R, -1).mean((1, 2))

    handles = [m.register_forward_pre_hook(hook) for m in layers]
    try:
        for _, ids in docs:
            model(torch.tensor(ids[:tokens])[None], None)
    finally:
        for h in handles:
            h.remove()
    n = len(docs)
    order = sorted(range(c.n_layers), key=lambda i: -float(diff[i].sum()))
    return {"mass": (mass / n).tolist(), "diff": (diff / n).tolist(), "layers_by_diff": order}


@torch.inference_mode()
def ppl(lm: LoadedModel, docs: list[tuple[str, list[int]]], variants: list[str], log: Any) -> dict[str, Any]:
    c = lm.config
    edge = c.sinks + c.window
    rows: dict[str, dict[str, float]] = {}
    for spec in variants:
        name, _, what = spec.partition("=")
        t0 = time.perf_counter()
        if what == "full":
            model = variant_model(lm, FULL, max(len(ids) for _, ids in docs)).model
        else:
            where, _, slots = what.partition(":")
            layers = parse_layers(where, c.n_layers)
            main, _, rest = slots.partition("+")  # M, or M+R: R slots in the other layers (`memory_rest_slots`)
            M = int(main) if layers else 0
            R = int(rest) if rest and M and len(layers) < c.n_layers else 0
            config = dataclasses.replace(c, memory_slots=M, memory_policy="novelty", memory_layers=layers if M else (),
                                         memory_rest_slots=R)
            model = model_from_tensors(config, dict(lm.model.state_dict()), where=name).eval()
        losses = [token_losses(model, ids, 512) for _, ids in docs]
        rows[name] = {"past_2048": perplexity(losses, edge, 2047), "past_4096": perplexity(losses, edge, 4095), "spec": what}
        log(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[name].items() if k != "spec")
            + f" ({time.perf_counter() - t0:.0f} s)")
    full, window = rows.get("full"), rows.get("window")
    if full and window:
        for r in rows.values():
            for band in ("past_2048", "past_4096"):
                r[f"{band}_gap_closed"] = (window[band] - r[band]) / (window[band] - full[band])
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=("rank", "ppl"))
    ap.add_argument("variants", nargs="*", help="ppl: NAME=LAYERS:M or NAME=full")
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus.build directory (its train.jsonl)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    log = lambda m: print(f"[{time.perf_counter() - t0:6.0f} s] {m}", flush=True)  # noqa: E731
    lm = load_model_dir(args.model)
    docs = train_docs(args.corpus, lm.tokenizer.encode, args.tokens)
    log(f"{len(docs)} training documents: {', '.join(d for d, _ in docs)}")
    result = rank(lm, docs, args.tokens) if args.cmd == "rank" else ppl(lm, [(d, ids[: args.tokens]) for d, ids in docs],
                                                                         args.variants, log)
    report = {"measure": f"memory_layers {args.cmd}", "model": str(args.model), "docs": [d for d, _ in docs],
              "tokens": args.tokens, "result": result}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text if args.cmd == "rank" else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
