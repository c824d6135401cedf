"""The fair baseline: a softmax-attention transformer of the demo model's widths,
trained on the same rows, in the same order, with the same optimizer split and schedule
for as many steps as the GLA gate checkpoint, then scored on the same held-out text.

Only the attention differs (SoftmaxModel: fused qkv + rotary, causal softmax; the GLA
model has q/k/v/gate/o, a short conv and decays). Muon takes every 2-D matrix inside the
blocks (the fused qkv included), AdamW the embeddings, head and norms, as in the Trainer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from recipes.demo_model.plan import BATCH_TOKENS, MODEL, PLAN
from recipes.demo_model.corpus import read_passages, split_passages
from recipes.demo_model.train import held_out_perplexity, log
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.softmax import SoftmaxModel
from agent.train.data import IGNORE_INDEX, load_documents, pack, pad_token
from agent.train.optim import ParamSplit, build_optimizers, lr_factor, set_learning_rates


def _split(model: torch.nn.Module) -> ParamSplit:
    muon, adamw = [], []
    for name, p in model.named_parameters():
        (muon if name.startswith("blocks.") and p.dim() == 2 else adamw).append((name, p))
    return ParamSplit(muon, adamw)


def run_baseline(work: Path, *, seed: int = 0, threads: int = 2) -> dict[str, Any]:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    gla = load_model_dir(work / "gate_ckpt")
    tok, template = gla.tokenizer, gla.template
    first = PLAN[0]  # the gate checkpoint's stage: its rows, steps and schedule
    length, steps, sched = first.rows, first.n_steps, first.schedule
    docs, _ = load_documents([str(work / "data" / first.name)], tok, template)
    data = pack(docs, length, pad_token(tok))
    model = SoftmaxModel(MODEL).train()
    opts = build_optimizers(_split(model), muon_lr=sched.lr, adamw_lr=sched.lr)
    rows_per_step = BATCH_TOKENS // length
    t0 = time.perf_counter()
    for step in range(steps):
        set_learning_rates(opts, lr_factor(step, sched.total, schedule="wsd", warmup=sched.warmup, decay_fraction=sched.decay))
        inputs, labels = data.rows(data.row_order(step, rows_per_step, seed))
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        for opt in opts:
            opt.step()
        if (step + 1) % 20 == 0:
            log(f"softmax baseline step {step + 1}/{steps} loss {float(loss):.3f}")
    wall = time.perf_counter() - t0
    model.eval()
    _, held_p = split_passages(read_passages())
    ppl_soft = held_out_perplexity(lambda x: model(x), tok, template, held_p)
    ppl_gla = held_out_perplexity(lambda x: gla.model(x)[0], tok, template, held_p)
    n_soft = sum(p.numel() for p in model.parameters())
    result = {"steps": steps, "tokens": steps * BATCH_TOKENS, "softmax_parameters": n_soft, "gla_parameters": MODEL.parameters(),
              "softmax_ppl": ppl_soft, "gla_ppl_same_tokens": ppl_gla, "softmax_tokens_per_s": steps * BATCH_TOKENS / wall}
    (work / "baseline.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    log(f"baseline: {result}")
    return result


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Train the softmax baseline on the recipe's first-stage rows (needs a finished gate checkpoint).")
    ap.add_argument("--work", default="/tmp/laplace-default-build")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    run_baseline(Path(a.work), seed=a.seed, threads=a.threads)


if __name__ == "__main__":
    main()
