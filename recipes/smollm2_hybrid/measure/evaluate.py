"""Side-by-side measurements of the default model's variants (issue 27): held-out perplexity
by position, and the table that joins it with `laplace probe natural`'s recall.

    python -m recipes.smollm2_hybrid.measure.evaluate ppl --model DIR --corpus CORPUS_DIR --out ppl-NAME.json
    python -m recipes.smollm2_hybrid.measure.evaluate table --ppl ppl-*.json --natural NAME=natural.json ...

`ppl`: the first --tokens tokens of --docs held-out documents (the corpus's heldout.jsonl,
which no training reads; one document per source, `held_out_docs`), read in --segment-token pieces through the runtime with the state
carried, as a chat session reads. It stores every prediction's loss, so the table can cut
them by position: the query positions below S + W (where every variant is the teacher:
"nothing lost within the window"), and from S + W on up to 2,048 and to 4,096 tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from recipes.smollm2_hybrid.measure.perplexity import perplexity, teacher_losses, token_losses


def held_out_docs(corpus: Path, encode, tokens: int, count: int) -> list[tuple[str, list[int]]]:  # type: ignore[no-untyped-def]
    """(doc_id, first `tokens` ids) for `count` held-out documents: the first long enough
    document of each source, sources taken from the most held-out text down (so the picks
    follow where the held-out text is, not the alphabet)."""
    by_source: dict[str, list[dict]] = {}
    with open(corpus / "heldout.jsonl", encoding="utf-8") as f:
        for d in map(json.loads, f):
            by_source.setdefault(d["source"], []).append(d)
    picked = []
    for source in sorted(by_source, key=lambda s: (-sum(len(d["text"]) for d in by_source[s]), s)):
        for d in by_source[source]:
            if len(d["text"]) < 3 * tokens:  # too short to hold `tokens` tokens of English
                continue
            ids = encode(d["text"])
            if len(ids) >= tokens:
                picked.append((d["doc_id"], ids[:tokens]))
                break
        if len(picked) == count:
            break
    return picked


def cmd_ppl(args: argparse.Namespace) -> None:
    from agent.runtime.checkpoint import load_model_dir

    torch.set_num_threads(args.threads)
    lm = load_model_dir(args.model)
    docs = held_out_docs(args.corpus, lm.tokenizer.encode, args.tokens, args.docs)
    c = lm.model.config
    rep = {"model": args.model.name, "window": c.window, "sinks": c.sinks, "gla_branch": c.gla_branch,
           "fingerprint": lm.fingerprint, "tokens": args.tokens, "docs": [d for d, _ in docs]}
    if args.teacher_gguf:  # the teacher itself, beside the runtime's variants: the window's full length costs too much here
        from recipes.smollm2_hybrid.hybrid import teacher

        g = args.teacher_gguf
        llama = teacher(g)
        run = lambda ids: teacher_losses(llama, ids)  # noqa: E731
        rep.update(model=f"teacher ({g.name}, transformers)", window=None, gla_branch=False, fingerprint=None)
    else:
        run = lambda ids: token_losses(lm.model.eval(), ids, args.segment)  # noqa: E731
    t0 = time.time()
    losses = []
    for doc_id, ids in docs:
        losses.append(run(ids))
        print(f"{rep['model']} {doc_id}: ppl {math.exp(sum(losses[-1]) / len(losses[-1])):.3f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    rep["losses"] = losses
    args.out.write_text(json.dumps(rep) + "\n")


def cmd_table(args: argparse.Namespace) -> None:
    reps = [json.loads(p.read_text()) for p in args.ppl]
    edge = 4 + 256  # S + W of the default model: the first query whose window drops a key
    cols = [("within S+W", 0, edge), ("S+W..2048", edge, 2047), ("S+W..4096", edge, 4095)]
    print("| model | " + " | ".join(f"ppl {n}" for n, _, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in reps:
        print(f"| {r['model']} | " + " | ".join(f"{perplexity(r['losses'], lo, hi):.3f}" for _, lo, hi in cols) + " |")
    bands = [(edge, 512), (512, 1024), (1024, 2047), (2047, 4095)]  # where along the text it goes wrong
    print("\n| model | " + " | ".join(f"ppl {lo}..{hi}" for lo, hi in bands) + " |")
    print("|---|" + "---|" * len(bands))
    for r in reps:
        print(f"| {r['model']} | " + " | ".join(f"{perplexity(r['losses'], lo, hi):.3f}" for lo, hi in bands) + " |")
    print(f"\n{len(reps[0]['docs'])} held-out documents: {', '.join(reps[0]['docs'])}")
    if args.natural:
        print("\n| model | refresh | distance | recalled | wrong | not told when never stated |\n|---|---|---|---|---|---|")
        for item in args.natural:
            name, path = item.split("=", 1)
            for row in json.loads(Path(path).read_text())["rows"]:
                n = row["n"]
                print(f"| {name} | {row['mode']} | {row['distance']} | {round(row['recall'] * n)}/{n} | "
                      f"{round(row['wrong'] * n)}/{n} | {round(row['not_told'] * n)}/{n} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ppl")
    p.add_argument("--model", type=Path, required=True, help="a model directory")
    p.add_argument("--corpus", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--segment", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--teacher-gguf", type=Path, help="measure the teacher itself from this GGUF (transformers' Llama); "
                   "--model then only supplies the tokenizer")
    t = sub.add_parser("table")
    t.add_argument("--ppl", type=Path, nargs="+", required=True)
    t.add_argument("--natural", nargs="*", default=[], metavar="NAME=JSON")
    args = ap.parse_args()
    {"ppl": cmd_ppl, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
