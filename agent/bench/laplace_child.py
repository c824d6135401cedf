"""`python -m agent.bench.laplace_child SPEC`: laplace's side of `laplace bench llamacpp`.

SPEC is a JSON object: model (a model directory), weights (fp32 | bf16 | int8), threads,
prompt, gen, depth, seed, and engine (optional: "torch", the default, or "native"). With
torch the model is loaded the way chat loads it, through the runtime's public API
(`load_model_dir`, `EagerRunner.prefill` / `step_`); with "native" by the torch-free engine
(`runtime/native/engine.py`: fp32 or int8, never importing torch), with the tokenizer loaded
as a chat would. Either is measured as `llama-bench -p prompt -n gen -d depth` measures llama.cpp:

- warm-up: a short prefill and a few decode steps (llama-bench warms up too);
- prefill: `depth` tokens read (untimed), then `prompt` more timed;
- decode: `depth` tokens read again into a fresh state (untimed), then `gen` greedy steps timed.

Prints one JSON line: prefill_s, decode_s, peak_kb (this process's VmHWM: fresh after exec,
unlike ru_maxrss), tokens (the greedy ones) and the thread count torch used.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any, Sequence

WEIGHTS = ("fp32", "bf16", "int8")


def vm_hwm_kb() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])


def prompt_ids(vocab: int, n: int, seed: int) -> list[int]:
    """n token ids drawn uniformly below `vocab`, fixed by the seed (llama-bench's are random too)."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def load(model: str, weights: str) -> Any:
    import torch

    from agent.runtime.checkpoint import load_model_dir

    if weights not in WEIGHTS:
        raise SystemExit(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    return load_model_dir(model, dtype=dtype, quant="int8" if weights == "int8" else None, decode_layout=True)


def read(runner: Any, ids: Sequence[int]) -> tuple[Any, Any]:
    """(logits, state) after `ids`, or (None, None) for none (depth 0)."""
    return runner.prefill(ids) if ids else (None, None)


def timed_prefill(runner: Any, depth_ids: Sequence[int], ids: Sequence[int]) -> float:
    _, state = read(runner, depth_ids)
    t = time.perf_counter()
    runner.prefill(ids, state)
    return time.perf_counter() - t


def timed_decode(runner: Any, depth_ids: Sequence[int], first: int, n: int) -> tuple[float, list[int]]:
    import torch

    logits, state = read(runner, depth_ids)
    if state is None:  # depth 0: the first token is read as a one-token prefill, like llama-bench's
        logits, state = runner.prefill([first])
    tok = logits.argmax(-1)
    tokens: list[int] = []
    t = time.perf_counter()
    with torch.inference_mode():
        for _ in range(n):
            tokens.append(int(tok))
            tok = runner.step_(tok, state).argmax(-1)
    return time.perf_counter() - t, tokens


def measure_native(spec: dict[str, Any]) -> dict[str, Any]:
    """The same protocol on the torch-free engine (same ids, same greedy decode)."""
    from agent.runtime.native.engine import Engine, EngineUnavailable
    from agent.runtime.tokenizer import Tokenizer

    threads = int(spec["threads"])
    try:
        engine = Engine.load(spec["model"], weights=spec["weights"], threads=threads)
    except EngineUnavailable as e:
        raise SystemExit(f"the native engine cannot run this: {e}") from None
    tokenizer = Tokenizer.from_file(f"{spec['model']}/tokenizer.json")
    vocab = min(engine.config.vocab_size, tokenizer.vocab_size)
    depth, prompt, gen = int(spec["depth"]), int(spec["prompt"]), int(spec["gen"])
    ids = prompt_ids(vocab, depth + prompt, int(spec.get("seed", 0)))

    def read(depth_ids: Sequence[int]) -> tuple[Any, Any]:
        state = engine.new_state()
        return (engine.prefill(depth_ids, state) if depth_ids else None), state

    def decode(depth_ids: Sequence[int], n: int) -> tuple[float, list[int]]:
        logits, state = read(depth_ids)
        if logits is None:
            logits = engine.prefill([ids[0]], state)
        tok, tokens = int(logits.argmax()), []
        t = time.perf_counter()
        for _ in range(n):
            tokens.append(tok)
            tok = int(engine.step(tok, state).argmax())
        return time.perf_counter() - t, tokens

    decode(ids[: min(64, depth + prompt)], 4)  # warm-up, as the torch child
    _, state = read(ids[:depth])
    t = time.perf_counter()
    engine.prefill(ids[depth:], state)
    prefill_s = time.perf_counter() - t
    decode_s, tokens = decode(ids[:depth], gen)
    return {"prefill_s": prefill_s, "decode_s": decode_s, "peak_kb": vm_hwm_kb(), "tokens": tokens,
            "torch_threads": threads, "torch_imported": "torch" in sys.modules}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("engine", "torch") == "native":
        return measure_native(spec)
    import torch

    from agent.runtime.generation import EagerRunner

    torch.set_num_threads(int(spec["threads"]))
    lm = load(spec["model"], spec["weights"])
    runner = EagerRunner(lm.model)
    vocab = min(lm.model.config.vocab_size, lm.tokenizer.vocab_size)
    depth, prompt, gen = int(spec["depth"]), int(spec["prompt"]), int(spec["gen"])
    ids = prompt_ids(vocab, depth + prompt, int(spec.get("seed", 0)))
    timed_decode(runner, ids[: min(64, depth + prompt)], ids[0], 4)  # warm thread pools and the allocator
    prefill_s = timed_prefill(runner, ids[:depth], ids[depth:])
    decode_s, tokens = timed_decode(runner, ids[:depth], ids[0], gen)
    return {"prefill_s": prefill_s, "decode_s": decode_s, "peak_kb": vm_hwm_kb(), "tokens": tokens,
            "torch_threads": torch.get_num_threads()}


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m agent.bench.laplace_child '{\"model\": DIR, \"weights\": \"fp32\", ...}'", file=sys.stderr)
        return 2
    print(json.dumps(measure(json.loads(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
