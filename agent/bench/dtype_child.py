"""One dtype's run for `laplace bench dtype` (agent/bench/dtype.py), in its own process so
its peak memory is its own:

    python -m agent.bench.dtype_child MODEL DTYPE --models-dir DIR --text FILE [--prefill 512]
        [--decode 128] [--rounds 3] [--threads 2]

Prints one JSON line: prefill and decode speed (medians over rounds), peak RSS, and for
quality the per-token losses' mean over the text, the argmax at every position of the
text, and the greedy continuation of the speed prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "int8")


def kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])


def measure(model: str, dtype: str, *, models_dir: str, text: str, prefill: int, decode: int, rounds: int,
            threads: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from agent.runtime.checkpoint import load_model
    from agent.runtime.device import parse_dtype
    from agent.runtime.generation import EagerRunner

    torch.set_num_threads(threads)
    quant = "int8" if dtype == "int8" else None
    lm = load_model(model, models_dir=Path(models_dir), quant=quant, dtype=parse_dtype("float32" if quant else dtype),
                    decode_layout=True)  # as chat loads it
    runner = EagerRunner(lm.model)
    ids = lm.tokenizer.encode(text)
    if len(ids) < prefill + 2:
        raise SystemExit(f"the held-out text has {len(ids)} tokens, fewer than --prefill {prefill} + 2; give a longer --text")
    prompt = ids[:prefill]
    prefill_tps, decode_tps, greedy = [], [], []
    with torch.inference_mode():
        for r in range(rounds):
            t = time.perf_counter()
            logits, state = runner.prefill(prompt)
            prefill_tps.append(prefill / (time.perf_counter() - t))
            tok = logits.argmax(-1)
            out = []
            t = time.perf_counter()
            for _ in range(decode):
                out.append(int(tok))
                tok = runner.step_(tok, state).argmax(-1)
            decode_tps.append(decode / (time.perf_counter() - t))
            greedy = greedy or out
        peak_kb = kb("VmHWM")  # the speed runs' peak, as chat's: the quality pass below holds whole-text logits
        # Quality: every next-token loss and argmax over the whole text, read a segment a
        # call with the state carried (as a session reads).
        x = torch.tensor(ids)
        losses, top = [], []
        st = None
        seg = runner.segment_len
        for s in range(0, len(ids) - 1, seg):
            part = x[s : min(s + seg, len(ids) - 1)]
            logits, st = lm.model(part[None], st)
            losses += F.cross_entropy(logits[0].float(), x[s + 1 : s + 1 + len(part)], reduction="none").tolist()
            top += logits[0].argmax(-1).tolist()
    return {"dtype": dtype, "prefill_tok_s": statistics.median(prefill_tps), "decode_tok_s": statistics.median(decode_tps),
            "peak_rss_MB": peak_kb / 1024, "nll": sum(losses) / len(losses), "ppl": math.exp(sum(losses) / len(losses)),
            "tokens_scored": len(losses), "argmax": top, "greedy": greedy, "threads": threads}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agent.bench.dtype_child")
    p.add_argument("model")
    p.add_argument("dtype", choices=DTYPES)
    p.add_argument("--models-dir", default="")
    p.add_argument("--text", required=True)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model, a.dtype, models_dir=a.models_dir, text=Path(a.text).read_text(encoding="utf-8"),
                             prefill=a.prefill, decode=a.decode, rounds=a.rounds, threads=a.threads)))


if __name__ == "__main__":
    main()
