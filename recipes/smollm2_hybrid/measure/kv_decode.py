"""Decode speed and memory at long contexts: the hybrid's fixed state against the teacher's KV cache.

    python -m recipes.smollm2_hybrid.measure.kv_decode --model ~/.local/share/laplace/models/default --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --contexts 1024,8192,32768 --steps 32 --threads 2

The teacher (transformers' LlamaForCausalLM on the same GGUF, fp32, sdpa) decodes with a KV
cache already holding N tokens; a decode step's cost depends on the cache's size, not on what
it holds, so the cache is filled with random keys and values of the right shape instead of
reading N tokens first (which would take hours at 32k on 2 cores). The hybrid decodes from a
state that has read a short prompt: its state is the same size after any number of tokens, so
its step costs the same at every N (the ring buffer is full after W tokens; it is filled here).
Both sides alternate, step by step, in one process. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def _kv_cache(model, n: int):  # type: ignore[no-untyped-def]
    from transformers import DynamicCache

    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    cache = DynamicCache()
    g = torch.Generator().manual_seed(0)
    for layer in range(c.num_hidden_layers):
        k = torch.randn(1, c.num_key_value_heads, n, head_dim, generator=g)
        v = torch.randn(1, c.num_key_value_heads, n, head_dim, generator=g)
        cache.update(k, v, layer)
    return cache


def kv_bytes(model, n: int) -> int:  # type: ignore[no-untyped-def]
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * n * 4


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    from agent.runtime.checkpoint import load_model
    from agent.runtime.generation import EagerRunner
    from recipes.smollm2_hybrid.hybrid import teacher as load_teacher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the hybrid: a model name or directory")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--gguf", required=True, type=Path, help="the teacher's GGUF")
    ap.add_argument("--contexts", default="1024,8192,32768")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, models_dir=Path(args.models_dir) if args.models_dir else None)
    runner = EagerRunner(lm.model)
    prompt = list(range(10, 10 + lm.config.window + lm.config.sinks + 8))  # fills the ring: the full-size state
    _, state = runner.prefill(prompt)
    teacher = load_teacher(args.gguf)
    tok = torch.tensor([prompt[-1]])
    rows = []
    for n in (int(x) for x in args.contexts.split(",")):
        cache = _kv_cache(teacher, n)
        pos = torch.tensor([[n]])
        hybrid_t, teacher_t = [], []
        runner.step_(tok, state)
        teacher(tok[None], cache=cache, position_ids=pos, use_cache=True)
        cache.crop(-1)
        for _ in range(args.steps):  # alternate, step by step
            t = time.perf_counter()
            runner.step_(tok, state)  # in place, as chat decodes
            hybrid_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            teacher(tok[None], cache=cache, position_ids=pos, use_cache=True)
            teacher_t.append(time.perf_counter() - t)
            cache.crop(-1)  # back to N: the same N every step
        h, k = statistics.median(hybrid_t), statistics.median(teacher_t)
        rows.append({"context": n, "hybrid_tok_s": round(1 / h, 2), "teacher_kv_tok_s": round(1 / k, 2),
                     "speed_ratio": round(k / h, 2), "hybrid_state_bytes": lm.config.state_bytes(),
                     "teacher_kv_bytes_fp32": kv_bytes(teacher, n)})
        del cache
    print(json.dumps({"threads": args.threads, "steps": args.steps, "model": args.model, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
