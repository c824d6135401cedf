"""Perplexity and decode speed of a Llama teacher's window hybrid (issue 26).

    python -m recipes.smollm2_hybrid.measure.variants --gguf SmolLM2-135M-Instruct.Q4_1.gguf

Perplexity on the first --tokens tokens of English the standard library carries
(`recipes.smollm2_hybrid.text`: --text reference, the language reference's prose, or docstrings,
whose code examples repeat identifiers far apart), read in one pass: full attention (a window as long as the text)
against the window W + S sinks with the branch off and at its init in both combine modes
(softmax's beta = exp(-4) is not exactly 0). Decode speed: fp32, --threads threads, after a
--prefill-token prompt, over --decode single-token steps (median and fastest step; with
--baseline also transformers' own Llama with its KV cache, with --compiled also the compiled
runner). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from agent.importers.gguf_source import read_gguf
from agent.importers.llama import HybridOptions
from agent.runtime.generation import EagerRunner
from recipes.smollm2_hybrid.hybrid import build, teacher
from recipes.smollm2_hybrid.measure.perplexity import whole_and_tail
from recipes.smollm2_hybrid.text import TEXTS


def _rates(times: list[float]) -> dict[str, float]:
    """Tokens/s from per-step times: at the median step and at the fastest (the machine is
    shared, so the fastest is the least disturbed)."""
    times = sorted(times)
    return {"median": round(1 / times[len(times) // 2], 2), "best": round(1 / times[0], 2)}


@torch.inference_mode()
def decode_speed(model: torch.nn.Module, prompt: list[int], steps: int, compiled: bool = False) -> dict[str, float]:
    """Eager, or steps through the compiled runner (Inductor, batch width 1: minutes to
    compile); the prompt is read eagerly either way."""
    runner = EagerRunner(model)
    _, state = runner.prefill(prompt)
    if compiled:
        from agent.runtime.compiled import CompiledRunner

        runner = CompiledRunner(model, backend="inductor", segment_len=512, segment_buckets=(512,), batch_widths=(1,))
    tok = torch.tensor([prompt[-1]])
    runner.step(tok, state)  # warm
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        _, state = runner.step(tok, state)
        times.append(time.perf_counter() - t)
    return _rates(times)


@torch.inference_mode()
def teacher_decode_speed(gguf: Path, prompt: list[int], steps: int) -> dict[str, float]:
    """The baseline: transformers' LlamaForCausalLM on the same GGUF with its KV cache."""
    model = teacher(gguf)
    out = model(torch.tensor([prompt]), use_cache=True)
    cache, tok = out.past_key_values, torch.tensor([[prompt[-1]]])
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        cache = model(tok, past_key_values=cache, use_cache=True).past_key_values
        times.append(time.perf_counter() - t)
    return _rates(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--text", choices=sorted(TEXTS), default="reference")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-ppl", action="store_true")
    ap.add_argument("--baseline", action="store_true", help="also time transformers' LlamaForCausalLM (a test extra)")
    ap.add_argument("--compiled", action="store_true", help="also time the compiled runner (Inductor; compiles for minutes)")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    args = ap.parse_args()
    g = read_gguf(args.gguf)
    ids = torch.tensor(g.tokenizer.encode(TEXTS[args.text](6 * args.tokens))[: args.tokens])
    assert len(ids) == args.tokens, "not enough text"
    tail = args.tokens // 2
    out: dict = {"text": args.text, "tokens": args.tokens, "tail": tail, "threads": args.threads, "ppl": {}, "decode_tok_s": {}}
    runs = {
        "full": HybridOptions(window=args.tokens, sinks=args.sinks, gla_branch=False),
        f"window{args.window}+{args.sinks}": HybridOptions(window=args.window, sinks=args.sinks, gla_branch=False),
        f"window{args.window}+{args.sinks}+gla-softmax-init": HybridOptions(window=args.window, sinks=args.sinks, combine="softmax"),
        f"window{args.window}+{args.sinks}+gla-gated-init": HybridOptions(window=args.window, sinks=args.sinks, combine="gated"),
    }
    torch.set_num_threads(max(2, args.threads))
    for name, opts in ({} if args.skip_ppl else runs).items():
        model = build(g, opts)
        out["ppl"][name] = [round(x, 3) for x in whole_and_tail(model, ids, tail)]
        print(name, out["ppl"][name], flush=True)
    torch.set_num_threads(args.threads)
    if args.skip_decode:
        print(json.dumps(out, indent=2))
        return
    prompt = ids[: args.prefill].tolist()
    for name in (f"window{args.window}+{args.sinks}", f"window{args.window}+{args.sinks}+gla-softmax-init"):
        out["decode_tok_s"][name] = decode_speed(build(g, runs[name]), prompt, args.decode)
        print(name, out["decode_tok_s"][name], "tok/s", flush=True)
    if args.compiled:
        name = f"window{args.window}+{args.sinks}+gla-softmax-init-compiled"
        out["decode_tok_s"][name] = decode_speed(build(g, runs[name.removesuffix("-compiled")]), prompt, args.decode, compiled=True)
    if args.baseline:
        out["decode_tok_s"]["transformers-kv-cache"] = teacher_decode_speed(args.gguf, prompt, args.decode)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
