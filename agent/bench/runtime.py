"""Runtime benchmarks: the GLA kernel, decode cost vs context, batched decode throughput.

Baselines in the same run: the naive per-token GLA and causal softmax attention (SDPA) for
the kernel; a softmax KV-cache transformer of the same width for decode; the machine's
measured memory bandwidth for batch-1 decode.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from agent.bench.timing import median_seconds
from agent.runtime.config import PRESETS
from agent.runtime.generation import EagerRunner
from agent.runtime.gla import gla_chunked, gla_naive
from agent.runtime.model import build_model
from agent.runtime.softmax import KVCache, SoftmaxModel


def _kernel_inputs(T: int, H: int, K: int, V: int, grad: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen) / math.sqrt(K)
    v = torch.randn(1, T, H, V, generator=gen)
    g = (-math.log(2) / torch.tensor([2048 ** (h / (H - 1)) for h in range(H)])).expand(1, T, H).contiguous()
    return [t.requires_grad_(grad) for t in (q, k, v, g)]


def bench_kernel(quick: bool) -> dict[str, Any]:
    """Chunked GLA fwd and fwd+bwd vs naive GLA and causal SDPA, 4 heads of the 3B shape."""
    H, K, V = 4, 96, 192
    lengths = [512, 2048, 8192] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    # The per-token reference keeps one state per token for backward (T x H x K x V floats),
    # and softmax backward materializes T x T scores: cap both so a run fits in minutes.
    naive_max = {"fwd": 2048 if quick else 4096, "fwd+bwd": 1024 if quick else 2048}
    sdpa_bwd_max = 8192
    rows = []
    for T in lengths:
        row: dict[str, Any] = {"T": T}
        for mode, grad in (("fwd", False), ("fwd+bwd", True)):
            q, k, v, g = _kernel_inputs(T, H, K, V, grad)
            sdpa_q = torch.randn(1, H, T, V, requires_grad=grad)

            def run(fn):
                def call():
                    with torch.set_grad_enabled(grad):
                        out = fn()
                        if grad:
                            out.sum().backward()
                return call

            row[f"chunked_{mode}_ms"] = 1000 * median_seconds(run(lambda: gla_chunked(q, k, v, g)[0]), repeats=3)
            if not grad or T <= sdpa_bwd_max:
                row[f"sdpa_{mode}_ms"] = 1000 * median_seconds(
                    run(lambda: torch.nn.functional.scaled_dot_product_attention(sdpa_q, sdpa_q, sdpa_q, is_causal=True)), repeats=3
                )
                row[f"sdpa_over_chunked_{mode}"] = row[f"sdpa_{mode}_ms"] / row[f"chunked_{mode}_ms"]
            if T <= naive_max[mode]:
                row[f"naive_{mode}_ms"] = 1000 * median_seconds(run(lambda: gla_naive(q, k, v, g)[0]), repeats=1, warmup=0)
        rows.append(row)
        print(f"  kernel T={T} done", file=sys.stderr, flush=True)
    first, last = rows[0], rows[-1]
    scale = last["T"] / first["T"]
    return {
        "shape": {"B": 1, "H": H, "K": K, "V": V, "chunk": 128},
        "rows": rows,
        "summary": {
            "length_ratio": scale,
            "chunked_fwd_time_ratio": last["chunked_fwd_ms"] / first["chunked_fwd_ms"],
            "sdpa_fwd_time_ratio": last["sdpa_fwd_ms"] / first["sdpa_fwd_ms"],
            "naive_skipped_above_T": naive_max,
            "sdpa_fwd_bwd_skipped_above_T": sdpa_bwd_max,
        },
    }


@torch.inference_mode()
def bench_decode(quick: bool) -> dict[str, Any]:
    """ms per decoded token after N tokens of context: GLA state vs softmax KV cache."""
    cfg = PRESETS["laplace-small"]
    contexts = [1024, 4096, 16384] if quick else [1024, 4096, 16384, 65536]
    steps = 16 if quick else 32
    gla = build_model(cfg, seed=0).eval()
    soft = SoftmaxModel(cfg).eval()
    runner = EagerRunner(gla, segment_len=512)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (max(contexts),), generator=gen).tolist()

    def decode_ms(step) -> float:
        return 1000 * median_seconds(lambda: [step() for _ in range(steps)], repeats=5) / steps

    # Warm both models (thread pools, allocator) before the first measured context.
    warm = torch.tensor([[1]])
    for _ in range(3 * steps):
        gla(warm, gla.new_state(1))
        soft(warm, KVCache(cfg, 1, 8))

    rows, state, done = [], gla.new_state(1), 0
    for n in contexts:  # one prefill pass, forked at every context length
        _, state = runner.prefill(tokens[done:n], state)
        done = n
        tok = torch.tensor([1])
        fork = state.clone()
        gla_ms = decode_ms(lambda: runner.step(tok, fork))
        cache = KVCache(cfg, 1, n + steps * 5)
        # decode cost depends on how many (K, V) pairs are attended, not on their values
        cache.k[:, :, :, :n].normal_(generator=gen)
        cache.v[:, :, :, :n].normal_(generator=gen)

        def soft_step():
            cache.length = n  # attend to exactly n cached tokens every step
            soft(tok[None], cache)

        soft_ms = decode_ms(soft_step)
        rows.append({"context": n, "gla_ms_per_token": gla_ms, "softmax_ms_per_token": soft_ms,
                     "gla_state_bytes": state.nbytes, "softmax_kv_bytes": cfg.kv_cache_bytes(n, 4)})
    first, last = rows[0], rows[-1]
    return {
        "model": cfg.name,
        "rows": rows,
        "summary": {
            "contexts": f"{first['context']} -> {last['context']}",
            "gla_ratio_last_over_first": last["gla_ms_per_token"] / first["gla_ms_per_token"],
            "softmax_ratio_last_over_first": last["softmax_ms_per_token"] / first["softmax_ms_per_token"],
        },
    }


def copy_bandwidth_bytes_per_s(nbytes: int = 256 * 2**20) -> float:
    """Measured memory bandwidth: bytes read + written per second by a large copy."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    secs = median_seconds(lambda: dst.copy_(src), repeats=5)
    return 2 * nbytes / secs


@torch.inference_mode()
def bench_batch(quick: bool) -> dict[str, Any]:
    """Decode throughput vs batch width, and batch-1 decode vs the memory-bandwidth bound."""
    cfg = PRESETS["laplace-small"]
    model = build_model(cfg, seed=0).eval()
    runner = EagerRunner(model)
    widths = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16]
    steps = 16 if quick else 32
    rows = []
    for w in widths:
        state = model.new_state(w)
        tok = torch.ones(w, dtype=torch.long)
        secs = median_seconds(lambda: [runner.step(tok, state) for _ in range(steps)], repeats=3) / steps
        rows.append({"width": w, "ms_per_step": 1000 * secs, "tokens_per_s": w / secs})
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth_bytes_per_s()
    bound_ms = 1000 * weight_bytes / bandwidth  # every weight read once per batch-1 token
    for r in rows:
        r["speedup_vs_width_1"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {
        "model": cfg.name,
        "rows": rows,
        "summary": {
            "weight_bytes": weight_bytes,
            "copy_bandwidth_GBps": bandwidth / 1e9,
            "bandwidth_bound_ms_per_token": bound_ms,
            "batch1_ms_per_token": rows[0]["ms_per_step"],
            "batch1_fraction_of_bound": bound_ms / rows[0]["ms_per_step"],
            "best_tokens_per_s": max(r["tokens_per_s"] for r in rows),
        },
    }
