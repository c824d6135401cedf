"""One variant's run for `laplace bench window-memory` (agent/bench/window_memory.py), in its
own process so its timings and peak RSS are its own:

    python -m agent.bench.window_memory_child MODEL_DIR --slots M [--policy recall|attention|novelty]
        [--context 2048] [--prefill 512] [--decode 128] [--rounds 3] [--threads 2]

The model is loaded as chat loads it (`cli/chat.py` load_model_as): in its card's dtype (int8
for the default model: read straight into int8 from the file), the decode layout on; only its
config differs, by `dataclasses.replace` (memory_slots M, memory_policy), which adds no
tensors, so the strict load of the same weights holds.

The text is `heldout.txt` repeated until long enough (deterministic). `--context` tokens are
read first, untimed (past S + W + M, so the memory is full and turning over); then, from a
clone of that state each round, a timed prefill of the next `--prefill` tokens, and from
another clone `--decode` greedy `step_` steps, timed. Prints one JSON line: medians and the
rounds, the state's bytes (the config's arithmetic, checked against the real state) and the
memory's share, how full the memory was, and this process's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from agent.bench.laplace_child import vm_hwm_kb
from agent.runtime.config import MEMORY_POLICIES  # torch-free

HELDOUT = Path(__file__).with_name("heldout.txt")
WARMUP_TOKENS = 64  # a short prefill and a few steps first: thread pools and the allocator


def text_ids(tokenizer: Any, n: int) -> list[int]:
    """The first n token ids of heldout.txt repeated (the same ids in every child)."""
    ids = tokenizer.encode(HELDOUT.read_text(encoding="utf-8"))
    if not ids:
        raise SystemExit(f"{HELDOUT} encodes to no tokens")
    return (ids * -(-n // len(ids)))[:n]


def load_variant(model_dir: str, slots: int, policy: str | None) -> tuple[Any, Any, str]:
    """(model, tokenizer, the dtype it runs in): the model as chat loads it, its config changed."""
    from agent.runtime.checkpoint import PACKAGED_MODELS, card_run_dtype, model_from_file, read_config
    from agent.runtime.device import parse_dtype
    from agent.runtime.quant import QUANT_MODES
    from agent.runtime.tokenizer import Tokenizer

    root = Path(model_dir)
    config, _ = read_config(root)
    config = dataclasses.replace(config, memory_slots=slots, **({"memory_policy": policy} if policy else {}))
    dtype = card_run_dtype(str(root))
    quant = dtype if dtype in QUANT_MODES else None
    cache = PACKAGED_MODELS.resolve() not in root.resolve().parents  # as load_model_dir: the digest cached as chat caches it
    model, _ = model_from_file(config, root / "model.safetensors", dtype=parse_dtype("float32" if quant else dtype),
                               quant=quant, decode_layout=True, cache=cache)
    return model.eval(), Tokenizer.from_file(root / "tokenizer.json"), dtype


def measure(model_dir: str, *, slots: int, policy: str | None, context: int, prefill: int, decode: int, rounds: int,
            threads: int) -> dict[str, Any]:
    import torch

    from agent.runtime.generation import EagerRunner
    from agent.runtime.memory import MEMORY_NAMES

    torch.set_num_threads(threads)
    model, tokenizer, dtype = load_variant(model_dir, slots, policy)
    config = model.config
    runner = EagerRunner(model)
    ids = text_ids(tokenizer, context + prefill)
    prefill_s, decode_s = [], []
    with torch.inference_mode():
        logits, state = runner.prefill(ids[:WARMUP_TOKENS])
        for _ in range(4):
            runner.step_(logits.argmax(-1), state)
        logits, base = runner.prefill(ids[:context])
        filled = float((base.tensors["mem_pos"] != 0).float().mean()) if slots else None
        for _ in range(rounds):
            state = base.clone()
            t = time.perf_counter()
            runner.prefill(ids[context:], state)
            prefill_s.append(time.perf_counter() - t)
            state = base.clone()
            tok = logits.argmax(-1)
            t = time.perf_counter()
            for _ in range(decode):
                tok = runner.step_(tok, state).argmax(-1)
            decode_s.append(time.perf_counter() - t)
    spec = config.state_spec(1)
    size = {"float32": 4, "int64": 8}
    memory_bytes = sum(torch.Size(shape).numel() * size[dt] for name, (shape, dt) in spec.items() if name in MEMORY_NAMES)
    if base.nbytes != config.state_bytes():
        raise SystemExit(f"the state holds {base.nbytes} bytes, the config counts {config.state_bytes()}")
    return {"memory_slots": slots, "memory_policy": policy, "weights": dtype, "threads": torch.get_num_threads(),
            "context": context, "prefill_tok_s": prefill / statistics.median(prefill_s),
            "decode_tok_s": decode / statistics.median(decode_s), "prefill_s": prefill_s, "decode_s": decode_s,
            "state_bytes": config.state_bytes(), "memory_bytes": memory_bytes, "memory_filled": filled,
            "peak_kb": vm_hwm_kb()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agent.bench.window_memory_child")
    p.add_argument("model_dir")
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--policy", choices=MEMORY_POLICIES, default=None)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model_dir, slots=a.slots, policy=a.policy, context=a.context, prefill=a.prefill,
                             decode=a.decode, rounds=a.rounds, threads=a.threads)))


if __name__ == "__main__":
    main()
