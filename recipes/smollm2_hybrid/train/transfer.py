"""Attention transfer for the default model's GLA branch (issue 27), resumable.

    python -m recipes.smollm2_hybrid.train.transfer --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --corpus CORPUS_DIR --out RUN_DIR [--plan recipes/smollm2_hybrid/train/plan.json] [--until STEP]

LoLCATs' first stage on the window hybrid: the teacher's weights are frozen and only the
GLA branch of every layer (feature maps, decay gate, log beta) is trained so that the
layer's window + branch attention output matches the teacher's full attention output on
the same inputs. All layers come from one pass over the model's own weights with full
attention (the teacher's hidden states, `teacher_pass`); the loss of layer l is its MSE over
the positions past S + W (the only ones the branch changes) divided by the mean square of
its target, so that every layer counts alike; the layers' losses are independent, so each
is differentiated on its own (memory for one layer's graph at a time).

A run lives in RUN_DIR: `branch.safetensors` (the branch's tensors under the model's own
names, and the optimizer's moments under `adam.*`) with `branch.json` (format, plan, step,
Adam's step counts), replaced atomically every `checkpoint_every` steps and on SIGTERM, and
`log.jsonl` (one line per step), and `pid` (SIGTERM it to stop cleanly). Sequence i of the data is a function of (seed, i) and a
sequence is reused for `steps_per_seq` steps, so the data cursor is the step count and a
resumed run is bit-identical to an uninterrupted one (tests/recipes/test_smollm2_transfer.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from recipes.smollm2_hybrid.train.attention import layer_cache, window_errors
from recipes.smollm2_hybrid.train.mix import SequenceMix

FORMAT = "laplace-gla-transfer/1"
PLAN = Path(__file__).with_name("plan.json")


@dataclass(frozen=True, kw_only=True)
class Plan:
    seq_len: int
    steps: int
    steps_per_seq: int
    lr: float
    mix_lr: float
    warmup: int
    betas: tuple[float, float]
    clip: float
    seed: int
    temperature: float
    multipliers: dict[str, float] = field(default_factory=dict)
    checkpoint_every: int = 10
    eval_every: int = 20
    window: int = 256
    sinks: int = 4
    chunk: int = 64
    combine: str = "softmax"

    @classmethod
    def load(cls, path: Path) -> "Plan":
        raw = json.loads(path.read_text())
        raw = {k: v for k, v in raw.items() if not k.startswith("_")}  # "_why" notes
        raw["betas"] = tuple(raw["betas"])
        return cls(**raw)


@torch.no_grad()
def teacher_pass(model: nn.Module, ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Every layer's training cache (`attention.layer_cache`) from one pass of the model's own
    weights with full attention: the input of layer l is the teacher's residual stream, the
    full-attention output of layer l is what flows on. ids [T] -> one dict per layer."""
    x = model.embed(ids[None])
    caches = []
    for i, block in enumerate(model.blocks):
        h = block.attn_norm(x)
        c = layer_cache(block.attn, h[0])
        caches.append(c)
        if i == len(model.blocks) - 1:
            break  # the last layer's output is not needed
        B, T = x.shape[:2]
        x = x + block.attn.o_proj(c["target"].reshape(B, T, -1).to(x.dtype))
        if block.ffn is not None:
            x = x + block.ffn(block.ffn_norm(x))
    return caches


def layer_losses(attn: nn.Module, cache: dict[str, torch.Tensor], start: int) -> tuple[torch.Tensor, float]:
    """(the training loss: MSE past `start` / the target's mean square; the same MSE
    relative to the window alone's, 1.0 = the branch adds nothing)."""
    mse, base = window_errors(attn, cache, start)
    return mse / cache["target"][:, start:].pow(2).mean(), float(mse.detach() / base)


def param_groups(model: nn.Module, plan: Plan) -> list[dict]:
    """Two groups: the combination (log beta, or the gate) at `mix_lr`, which must move far
    from its init; the feature maps and decay gates at `lr`. Everything else is frozen, and
    every branch parameter lands in exactly one group."""
    mix, rest = [], []
    for name, p in model.named_parameters():
        trained = ".gla_branch." in name
        p.requires_grad_(trained)
        if trained:
            (mix if name.endswith((".log_beta", ".gate")) else rest).append((name, p))
    branch = [n for n, _ in model.named_parameters() if ".gla_branch." in n]
    assert sorted(n for n, _ in mix + rest) == sorted(branch) and branch, "a branch parameter without a group"
    return [{"name": "maps_and_decay", "params": [p for _, p in rest], "names": [n for n, _ in rest], "lr": plan.lr},
            {"name": "mix", "params": [p for _, p in mix], "names": [n for n, _ in mix], "lr": plan.mix_lr}]


def make_optimizer(model: nn.Module, plan: Plan) -> torch.optim.Adam:
    return torch.optim.Adam(param_groups(model, plan), betas=plan.betas, eps=1e-8)


def branch_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained tensors under the model's own state_dict names."""
    return {n: p.detach().clone().contiguous() for n, p in model.named_parameters() if ".gla_branch." in n}


def save_checkpoint(out: Path, model: nn.Module, opt: torch.optim.Adam, plan: Plan, step: int, extra: dict) -> None:
    """branch.safetensors + branch.json, each written to a temporary name and then renamed;
    the step goes into both, so a pair from different saves is refused on load."""
    tensors = branch_tensors(model)
    steps = {}
    for group in opt.param_groups:
        for name, p in zip(group["names"], group["params"]):
            st = opt.state.get(p)
            if st:
                tensors[f"adam.{name}.exp_avg"] = st["exp_avg"].contiguous()
                tensors[f"adam.{name}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
                steps[name] = float(st["step"])
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "branch.safetensors.tmp"), metadata={"format": FORMAT, "step": str(step)})
    meta = {"format": FORMAT, "step": step, "plan": asdict(plan), "adam_steps": steps, **extra}
    (out / "branch.json.tmp").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(out / "branch.safetensors.tmp", out / "branch.safetensors")
    os.replace(out / "branch.json.tmp", out / "branch.json")


def load_checkpoint(out: Path, model: nn.Module, opt: torch.optim.Adam, plan: Plan) -> dict:
    """Restore the branch and Adam's state in place; returns branch.json's contents.
    Strict: every branch tensor must be there, the plan must be the run's plan."""
    meta = json.loads((out / "branch.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{out}: not a {FORMAT} checkpoint")
    if meta["plan"] != json.loads(json.dumps(asdict(plan))):
        raise ValueError(f"{out}: the checkpoint was made with another plan; resume with the same plan")
    tensors = load_file(str(out / "branch.safetensors"))
    params = dict(model.named_parameters())
    names = [n for n in params if ".gla_branch." in n]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(f"{out}: checkpoint lacks {missing[:3]}")
    with torch.no_grad():
        for n in names:
            params[n].copy_(tensors[n])
    state = {}
    for group in opt.param_groups:
        for name, p in zip(group["names"], group["params"]):
            if name in meta["adam_steps"]:
                state[p] = {"step": torch.tensor(meta["adam_steps"][name], dtype=torch.float32),
                            "exp_avg": tensors[f"adam.{name}.exp_avg"].clone(),
                            "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"].clone()}
    opt.state.clear()
    opt.state.update(state)
    return meta


def train(model: nn.Module, mix: SequenceMix, plan: Plan, out: Path, *, until: int,
          held: list[dict[str, torch.Tensor]] | None = None, log: Callable[[str], None] = print,
          should_stop: Callable[[], bool] = lambda: False) -> int:
    """Train the branch from RUN_DIR's checkpoint (or the init) up to step `until`; returns
    the step reached. Progress lines: loss, relative MSE, tokens seen, tokens/s."""
    opt = make_optimizer(model, plan)
    out.mkdir(parents=True, exist_ok=True)
    step, spent = 0, 0.0
    if (out / "branch.json").exists():
        meta = load_checkpoint(out, model, opt, plan)
        step, spent = meta["step"], meta.get("seconds", 0.0)
        log(f"resumed at step {step} from {out}")
    start = plan.sinks + plan.window
    caches: list[dict[str, torch.Tensor]] = []
    cached_seq = -1
    t0 = time.time()
    with open(out / "log.jsonl", "a") as logf:
        while step < until and not should_stop():
            seq = step // plan.steps_per_seq
            if seq != cached_seq:
                caches = teacher_pass(model, torch.tensor(mix.sequence(seq)))
                cached_seq = seq
            for group in opt.param_groups:
                base = plan.lr if group["name"] == "maps_and_decay" else plan.mix_lr
                group["lr"] = base * min(1.0, (step + 1) / plan.warmup)
            opt.zero_grad(set_to_none=True)
            loss, rel = 0.0, 0.0
            for block, cache in zip(model.blocks, caches):
                lo, r = layer_losses(block.attn, cache, start)
                (lo / len(caches)).backward()
                loss += float(lo.detach()) / len(caches)
                rel += r / len(caches)
            params = [p for g in opt.param_groups for p in g["params"]]
            gnorm = float(torch.nn.utils.clip_grad_norm_(params, plan.clip))
            opt.step()
            step += 1
            tokens = (step + plan.steps_per_seq - 1) // plan.steps_per_seq * plan.seq_len
            now = spent + time.time() - t0
            rec = {"step": step, "loss": round(loss, 6), "rel_mse": round(rel, 5), "grad_norm": round(gnorm, 4),
                   "tokens_seen": tokens, "seconds": round(now, 1)}
            if held is not None and (step % plan.eval_every == 0 or step == until):
                rec["held_rel_mse"] = round(held_relative_mse(model, held, start), 5)
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            log(f"step {step} loss {loss:.5f} rel_mse {rel:.4f} grad {gnorm:.3f} tokens {tokens:,} "
                f"({tokens / max(now, 1e-9):.1f} tok/s)" + (f" held-out rel_mse {rec['held_rel_mse']}" if "held_rel_mse" in rec else ""))
            if step % plan.checkpoint_every == 0 or step == until or should_stop():
                save_checkpoint(out, model, opt, plan, step, {"seconds": round(now, 1), "tokens_seen": tokens})
    return step


@torch.no_grad()
def held_relative_mse(model: nn.Module, held: list[dict[str, torch.Tensor]], start: int) -> float:
    """The mean over layers of MSE relative to the window alone's on a held-out sequence."""
    return sum(layer_losses(b.attn, c, start)[1] for b, c in zip(model.blocks, held)) / len(held)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True, help="the corpus builder's folder (train.jsonl, heldout.jsonl)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--plan", type=Path, default=PLAN)
    ap.add_argument("--until", type=int, help="stop at this step (default: the plan's steps)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agent.importers.gguf_source import read_gguf
    from agent.importers.llama import HybridOptions
    from recipes.smollm2_hybrid.hybrid import build
    from recipes.smollm2_hybrid.train.mix import read_docs

    plan = Plan.load(args.plan)
    g = read_gguf(args.gguf)
    model = build(g, HybridOptions(window=plan.window, sinks=plan.sinks, combine=plan.combine, chunk_size=plan.chunk))
    eot = g.tokenizer.token_id("<|endoftext|>")
    kw = dict(seed=plan.seed, temperature=plan.temperature, multipliers=plan.multipliers)
    mix = SequenceMix(read_docs(args.corpus / "train.jsonl"), g.tokenizer.encode, eot, plan.seq_len, **kw)
    print("source weights:", {k: round(v, 4) for k, v in mix.weights.items()}, flush=True)
    held_mix = SequenceMix(read_docs(args.corpus / "heldout.jsonl"), g.tokenizer.encode, eot, plan.seq_len, **kw)
    held = teacher_pass(model, torch.tensor(held_mix.sequence(0)))
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))  # finish the step, checkpoint, exit
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pid").write_text(f"{os.getpid()}\n")  # whom to SIGTERM: not the shell that launched it
    step = train(model, mix, plan, args.out, until=args.until or plan.steps, held=held,
                 log=lambda s: print(s, flush=True), should_stop=lambda: stop["now"])
    print(f"stopped at step {step}; checkpoint in {args.out}", flush=True)


if __name__ == "__main__":
    main()
