"""One variant's run for `laplace bench window-memory` (agent/bench/window_memory.py), in its
own process so its timings and peak RSS are its own:

    python -m agent.bench.window_memory_child MODEL_DIR --slots M [--policy recall|attention|novelty]
        [--runtime torch|engine] [--context 2048] [--prefill 512] [--decode 128] [--rounds 3] [--threads 2]

The model is loaded as chat loads it, only its config changed by `dataclasses.replace`
(memory_slots M, memory_policy), which adds no tensors, so the same weights hold:
- torch (`cli/chat.py` load_model_as): in its card's dtype (int8 for the default model: read
  straight into int8 from the file), the decode layout on, the strict load;
- engine (the torch-free `runtime/native/engine.py`, as `cli/chat.py` engine_for opens it):
  int8 (the directory's int8 cache, written by one int8 torch load) when the card says int8,
  else fp32; this process never imports torch. The engine runs the "novelty" memory only.

The text is `heldout.txt` repeated until long enough (deterministic). `--context` tokens are
read first, untimed (past S + W + M, so the memory is full and turning over); then, from a
clone of that state each round, a timed prefill of the next `--prefill` tokens, and from
another clone `--decode` greedy steps, timed. Prints one JSON line: medians and the rounds,
the state's bytes (the config's arithmetic, checked against the real state) and the memory's
share, how full the memory was, the runtime, and this process's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


def variant_config(root: Path, slots: int, policy: str | None) -> Any:
    """The directory's config with memory_slots M and (when given) the policy."""
    from agent.runtime.modeldir import read_config

    config, _ = read_config(root)
    return with_memory(config, slots, policy)


def with_memory(config: Any, slots: int, policy: str | None) -> Any:
    """`config` with memory_slots M and (when given) the policy; M = 0 is the window alone
    (a second group of `memory_rest_slots` goes too). ValueError for a config that cannot be."""
    rest = {} if slots else {"memory_rest_slots": 0}
    return dataclasses.replace(config, memory_slots=slots, **rest, **({"memory_policy": policy} if policy else {}))


def load_variant(model_dir: str, slots: int, policy: str | None) -> tuple[Any, Any, str]:
    """(model, tokenizer, the dtype it runs in): the model as chat loads it, its config changed."""
    from agent.runtime.checkpoint import PACKAGED_MODELS, card_run_dtype, model_from_file
    from agent.runtime.device import parse_dtype
    from agent.runtime.quant import QUANT_MODES
    from agent.runtime.tokenizer import Tokenizer

    root = Path(model_dir)
    config = variant_config(root, slots, policy)
    dtype = card_run_dtype(str(root))
    quant = dtype if dtype in QUANT_MODES else None
    cache = PACKAGED_MODELS.resolve() not in root.resolve().parents  # as load_model_dir: the digest cached as chat caches it
    model, _ = model_from_file(config, root / "model.safetensors", dtype=parse_dtype("float32" if quant else dtype),
                               quant=quant, decode_layout=True, cache=cache)
    return model.eval(), Tokenizer.from_file(root / "tokenizer.json"), dtype


def time_rounds(read: Callable[[list[int]], tuple[Any, Any]], prefill: Callable[[list[int], Any], Any],
                step: Callable[[Any, Any], Any], greedy: Callable[[Any], Any], ids: list[int], *, context: int,
                decode: int, rounds: int) -> tuple[Any, list[float], list[float]]:
    """The protocol both runtimes share: warm-up, the context read (untimed), then each round a
    timed prefill of ids[context:] and `decode` timed greedy steps, each from a clone of the
    context's state. `read(ids)` -> (logits, a new state); `prefill(ids, state)` and
    `step(token, state)` advance the state in place; `greedy(logits)` -> the next token.
    Returns (the context's state, prefill seconds, decode seconds)."""
    logits, state = read(ids[:WARMUP_TOKENS])  # thread pools and the allocator
    tok = greedy(logits)
    for _ in range(4):
        tok = greedy(step(tok, state))
    logits, base = read(ids[:context])
    prefill_s, decode_s = [], []
    for _ in range(rounds):
        state = base.clone()
        t = time.perf_counter()
        prefill(ids[context:], state)
        prefill_s.append(time.perf_counter() - t)
        state = base.clone()
        tok = greedy(logits)
        t = time.perf_counter()
        for _ in range(decode):
            tok = greedy(step(tok, state))
        decode_s.append(time.perf_counter() - t)
    return base, prefill_s, decode_s


def spec_bytes(config: Any, names: Any) -> int:
    """Bytes of the state tensors `names` (those of `config.state_spec(1)` among them)."""
    from agent.runtime.state_spec import DTYPE_BYTES as size  # torch-free
    return sum(math.prod(shape) * size[dt] for name, (shape, dt) in config.state_spec(1).items() if name in names)


def measure_torch(model_dir: str, *, slots: int, policy: str | None, context: int, prefill: int, decode: int,
                  rounds: int, threads: int) -> dict[str, Any]:
    import torch

    from agent.runtime.generation import EagerRunner
    from agent.runtime.memory import EMPTY
    from agent.runtime.state_spec import MEMORY_TENSORS

    torch.set_num_threads(threads)
    model, tokenizer, dtype = load_variant(model_dir, slots, policy)
    config = model.config
    runner = EagerRunner(model)
    ids = text_ids(tokenizer, context + prefill)
    with torch.inference_mode():
        base, prefill_s, decode_s = time_rounds(runner.prefill, runner.prefill, runner.step_, lambda x: x.argmax(-1), ids,
                                                context=context, decode=decode, rounds=rounds)
    filled = float((base.tensors["mem_pos"] != EMPTY).float().mean()) if slots else None  # the main group's
    if base.nbytes != config.state_bytes():
        raise SystemExit(f"the state holds {base.nbytes} bytes, the config counts {config.state_bytes()}")
    return result(config, "torch", dtype, torch.get_num_threads(), context, prefill, decode, prefill_s, decode_s,
                  spec_bytes(config, MEMORY_TENSORS), filled)


def measure_engine(model_dir: str, *, slots: int, policy: str | None, context: int, prefill: int, decode: int,
                   rounds: int, threads: int) -> dict[str, Any]:
    """The same protocol on the torch-free engine: numpy logits, the state's arrays."""
    from agent.runtime.modeldir import card_run_dtype
    from agent.runtime.native.engine import Engine, EngineUnavailable
    from agent.runtime.state_spec import MEMORY_TENSORS
    from agent.runtime.tokenizer import Tokenizer

    root = Path(model_dir)
    config = variant_config(root, slots, policy)
    weights = "int8" if card_run_dtype(str(root)) == "int8" else "fp32"
    try:
        engine = Engine.load(root, weights=weights, threads=threads, config=config)
    except EngineUnavailable as e:
        raise SystemExit(f"the torch-free engine cannot run {root} (M {slots}, {config.memory_policy}): {e}") from None
    ids = text_ids(Tokenizer.from_file(root / "tokenizer.json"), context + prefill)

    def read(ids: list[int]) -> tuple[Any, Any]:
        state = engine.new_state()
        return engine.prefill(ids, state), state

    base, prefill_s, decode_s = time_rounds(read, engine.prefill, engine.step, lambda x: int(x.argmax()), ids,
                                            context=context, decode=decode, rounds=rounds)
    filled = float((base.tensors["mem_pos"] != 0).mean()) if slots else None  # 0: memory.EMPTY, an empty slot
    held = base.nbytes + spec_bytes(config, ("pos",))  # the engine keeps pos as an int (state.positions)
    if held != config.state_bytes():
        raise SystemExit(f"the engine's state holds {held} bytes, the config counts {config.state_bytes()}")
    return {**result(config, "engine", weights, threads, context, prefill, decode, prefill_s, decode_s,
                     spec_bytes(config, MEMORY_TENSORS), filled), "torch_imported": "torch" in sys.modules}


def result(config: Any, runtime: str, weights: str, threads: int, context: int, prefill: int, decode: int,
           prefill_s: list[float], decode_s: list[float], memory_bytes: int, filled: float | None) -> dict[str, Any]:
    return {"memory_slots": config.memory_slots, "memory_policy": config.memory_policy if config.memory_slots else None,
            "runtime": runtime, "weights": weights, "threads": threads, "context": context,
            "prefill_tok_s": prefill / statistics.median(prefill_s), "decode_tok_s": decode / statistics.median(decode_s),
            "prefill_s": prefill_s, "decode_s": decode_s, "state_bytes": config.state_bytes(),
            "memory_bytes": memory_bytes, "memory_filled": filled, "peak_kb": vm_hwm_kb()}


MEASURE = {"torch": measure_torch, "engine": measure_engine}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agent.bench.window_memory_child")
    p.add_argument("model_dir")
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--policy", choices=MEMORY_POLICIES, default=None)
    p.add_argument("--runtime", choices=tuple(MEASURE), default="torch")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(MEASURE[a.runtime](a.model_dir, slots=a.slots, policy=a.policy, context=a.context, prefill=a.prefill,
                             decode=a.decode, rounds=a.rounds, threads=a.threads)))


if __name__ == "__main__":
    main()
