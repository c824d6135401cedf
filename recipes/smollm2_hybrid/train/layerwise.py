"""Layerwise attention transfer for the GLA branch (issue 37): the teacher's per-layer inputs
and targets cached once on disk, then each layer's branch trained on its own.

    python -m recipes.smollm2_hybrid.train.layerwise cache --model MODEL_DIR --corpus CORPUS_DIR --out CACHE_DIR \\
        --seqs N --heldout-seqs K [--seq-len L] [--plan layerwise.json] [--threads 2]
    python -m recipes.smollm2_hybrid.train.layerwise train --cache CACHE_DIR --model MODEL_DIR --out RUN_DIR \\
        [--plan layerwise.json] [--layers 0-29] [--until STEP] [--threads 2]

`cache`: one pass of the model's own weights with full attention per sequence (no window, no
branch, no memory: `transfer.teacher_pass`, with the target from `attention.full_attention`).
CACHE_DIR/train/000017.safetensors holds the ids and, per layer l, `h.l` = attn_norm(x)
[T, d_model] and `y.l` = full attention before o_proj [T, H * D], bf16; held-out sequences
under heldout/. Each file is written whole (a .tmp, then renamed), so a rerun skips what is
there; `cache.json` names the teacher (a digest of its non-branch weights), the length and the
data's plan, and `train` refuses a cache that does not match.

`train`: layer after layer. For layer l, the window's part of each cached sequence (num, den,
the evicted keys, the memory's share in a layer with one) is computed once and held in RAM;
then only that layer's branch is trained (Adam, `epochs` passes, one sequence per step, the
loss of `transfer.layer_losses`). Varied windows: each (layer, sequence) draws one window from
the plan's shares, fixed for the run, so its window part is computed once (a draw per epoch
would mean a part per window held or recomputed every epoch); the loss counts positions past
S + that window. A layer's branch is kept only if its held-out relative MSE at the model's own
window is lower after training than before; otherwise its initial tensors are put back (the
log says so). RUN_DIR: `branch.safetensors` (every layer's branch under the model's names, and
the current layer's Adam moments) with `branch.json` (`export.py --run` reads the pair),
replaced after each layer and every `checkpoint_every` steps; `log.jsonl`; `pid` (SIGTERM:
finish the step, checkpoint, exit). The data order is a function of (seed, layer, epoch), so a
resumed run is bit-identical to an uninterrupted one (tests/recipes/test_smollm2_layerwise.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from agent.runtime.state_spec import memory_slots_of
from recipes.smollm2_hybrid.train.attention import full_attention, layer_cache
from recipes.smollm2_hybrid.train.mix import SequenceMix, read_docs
from recipes.smollm2_hybrid.train.transfer import branch_tensors, layer_losses, param_groups

CACHE_FORMAT = "laplace-teacher-cache/1"
FORMAT = "laplace-gla-layerwise/1"
PLAN = Path(__file__).with_name("layerwise.json")
EOT = "<|endoftext|>"
Parts = dict[str, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Plan:
    seq_len: int
    windows: dict[str, float]  # window -> share of the (layer, sequence) draws
    lr: float
    mix_lr: float
    betas: tuple[float, float]
    clip: float
    warmup: int
    epochs: int
    seed: int
    temperature: float
    multipliers: dict[str, float] = field(default_factory=dict)
    checkpoint_every: int = 50

    @classmethod
    def load(cls, path: Path) -> "Plan":
        raw = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}  # "_why" notes
        raw["betas"] = tuple(raw["betas"])
        return cls(**raw)


# ---- the cache ---------------------------------------------------------------------------


def teacher_id(model: nn.Module) -> str:
    """sha256 of what the teacher's pass reads: every non-branch weight and the config's
    attention geometry (the branch, window and memory do not change the cache)."""
    c = model.config
    h = hashlib.sha256(json.dumps([c.n_heads, c.n_kv_heads, c.head_k_dim, c.head_v_dim, c.rope_theta, c.norm_eps]).encode())
    for name, t in sorted(model.state_dict().items()):
        if ".gla_branch." not in name:
            t = t.detach().contiguous()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            h.update(t.view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


@torch.no_grad()
def teacher_tensors(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sequence's cache file: ids [T], and per layer l h.l [T, d_model], y.l [T, H * D]
    (bf16). The residual stream flows on with the fp32 target, as in `transfer.teacher_pass`."""
    x = model.embed(ids[None])
    out = {"ids": ids.clone()}
    for i, block in enumerate(model.blocks):
        h = block.attn_norm(x)
        y = full_attention(block.attn, h[0]).reshape(1, ids.shape[0], -1)
        out[f"h.{i}"], out[f"y.{i}"] = h[0].to(torch.bfloat16), y[0].to(torch.bfloat16)
        x = x + block.attn.o_proj(y.to(x.dtype))
        if block.ffn is not None:
            x = x + block.ffn(block.ffn_norm(x))
    return out


def cache_identity(model: nn.Module, name: str, plan: Plan, seq_len: int) -> dict:
    """What a cache is made of; `train` and a rerun of `cache` refuse any other."""
    config = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode()).hexdigest()
    return {"format": CACHE_FORMAT, "model": name, "config_sha256": config, "teacher": teacher_id(model), "seq_len": seq_len,
            "seed": plan.seed, "temperature": plan.temperature, "multipliers": plan.multipliers}


def seq_path(cache: Path, split: str, i: int) -> Path:
    return cache / split / f"{i:06d}.safetensors"


def build_cache(model: nn.Module, mixes: dict[str, SequenceMix], counts: dict[str, int], out: Path, identity: dict,
                log: Callable[[str], None] = print) -> int:
    """Write the missing sequence files of each split ("train", "heldout") up to its count;
    returns how many were written. A cache of another identity is refused."""
    manifest = out / "cache.json"
    old = json.loads(manifest.read_text()) if manifest.exists() else {}
    if old and old["identity"] != identity:
        raise ValueError(f"{out} holds a cache of another model, length or data plan; use another --out")
    counts = {s: max(n, old.get("seqs", {}).get(s, 0)) for s, n in counts.items()}
    out.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"identity": identity, "seqs": counts}, indent=1) + "\n")
    written = 0
    for split, n in counts.items():
        (out / split).mkdir(exist_ok=True)
        todo = [i for i in range(n) if not seq_path(out, split, i).exists()]
        t0 = time.time()
        for k, i in enumerate(todo):
            ids = torch.tensor(mixes[split].sequence(i))
            path = seq_path(out, split, i)
            save_file(teacher_tensors(model, ids), str(path.with_suffix(".tmp")), metadata={"format": CACHE_FORMAT})
            os.replace(path.with_suffix(".tmp"), path)  # a killed run leaves whole files only
            written += 1
            rate = (k + 1) * len(ids) / (time.time() - t0)
            log(f"{split} seq {i + 1}/{n} ({k + 1} of {len(todo)} new) {rate:.1f} tokens/s")
    return written


def read_manifest(cache: Path, model: nn.Module, plan: Plan) -> dict:
    """The cache's manifest, once it matches the model's teacher and the plan, and every
    sequence file it lists is there."""
    manifest = json.loads((cache / "cache.json").read_text())
    ident = manifest["identity"]
    if ident.get("format") != CACHE_FORMAT or ident["teacher"] != teacher_id(model):
        raise ValueError(f"{cache} was cached from another teacher than this model's weights")
    if ident["seq_len"] != plan.seq_len or ident["seed"] != plan.seed:
        raise ValueError(f"{cache} holds sequences of length {ident['seq_len']} (seed {ident['seed']}); "
                         f"the plan asks for {plan.seq_len} (seed {plan.seed})")
    missing = [str(seq_path(cache, s, i)) for s, n in manifest["seqs"].items() for i in range(n) if not seq_path(cache, s, i).exists()]
    if missing:
        raise ValueError(f"{cache} is incomplete ({len(missing)} files missing, e.g. {missing[0]}); rerun `cache`")
    return manifest


# ---- one layer's data ----------------------------------------------------------------------


def window_of(plan: Plan, layer: int, j: int) -> int:
    """The window sequence j trains layer `layer` at, a function of (seed, layer, j)."""
    rng = random.Random(f"window/{plan.seed}/{layer}/{j}")
    return int(rng.choices(list(plan.windows), weights=list(plan.windows.values()))[0])


def order_of(plan: Plan, layer: int, epoch: int, n: int) -> list[int]:
    """The order of the n training sequences in an epoch of a layer."""
    order = list(range(n))
    random.Random(f"order/{plan.seed}/{layer}/{epoch}").shuffle(order)
    return order


def layer_parts(attn: nn.Module, file: Path, layer: int, window: int, slots: int) -> Parts:
    """`layer_cache` of a cached sequence at `window`, the input and target kept in bf16 (as
    cached: no precision is lost; the step casts the target)."""
    with safe_open(str(file), "pt") as f:
        h, y = f.get_tensor(f"h.{layer}"), f.get_tensor(f"y.{layer}")
    c = attn.config
    target = y.float().reshape(1, h.shape[0], c.n_heads, c.head_v_dim)
    parts = layer_cache(attn, h.float(), window=window, memory_slots=slots, target=target)
    return parts | {"h": h[None], "target": y.reshape(1, h.shape[0], c.n_heads, c.head_v_dim)}


def losses(attn: nn.Module, parts: Parts, start: int) -> tuple[torch.Tensor, float]:
    return layer_losses(attn, parts | {"target": parts["target"].float()}, start)


@torch.no_grad()
def held_relative_mse(attn: nn.Module, held: list[Parts]) -> float:
    """Mean over the held-out sequences of MSE relative to the window alone's (1.0: the branch
    adds nothing), at the layer's own window."""
    start = attn.config.sinks + attn.config.window
    return sum(losses(attn, p, start)[1] for p in held) / len(held)


# ---- the run ------------------------------------------------------------------------------


def layer_optimizer(model: nn.Module, layer: int, plan: Plan) -> torch.optim.Adam:
    """Adam over layer `layer`'s branch alone, in `transfer.param_groups`' two groups (names
    under the model's own, blocks.{layer}.attn.gla_branch.*); everything else frozen."""
    model.requires_grad_(False)
    groups = param_groups(model.blocks[layer], plan)
    for g in groups:
        g["names"] = [f"blocks.{layer}.{n}" for n in g["names"]]
    return torch.optim.Adam(groups, betas=plan.betas, eps=1e-8)


def save_run(out: Path, model: nn.Module, opt: torch.optim.Adam | None, meta: dict) -> None:
    """branch.safetensors (branch tensors, Adam's moments of the current layer, the whole meta
    in its metadata: the one file a resume trusts) then branch.json (its copy, for `export`)."""
    tensors, steps = branch_tensors(model), {}
    for group in (opt.param_groups if opt is not None else []):
        for name, p in zip(group["names"], group["params"]):
            st = opt.state.get(p)  # type: ignore[union-attr]
            if st:
                tensors[f"adam.{name}.exp_avg"], tensors[f"adam.{name}.exp_avg_sq"] = st["exp_avg"], st["exp_avg_sq"]
                steps[name] = float(st["step"])
    if meta["current"] is not None:
        meta["current"]["adam_steps"] = steps
    text = json.dumps(meta, indent=1) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "branch.safetensors.tmp"), metadata={"format": FORMAT, "meta": text})
    os.replace(out / "branch.safetensors.tmp", out / "branch.safetensors")
    (out / "branch.json.tmp").write_text(text)
    os.replace(out / "branch.json.tmp", out / "branch.json")


def load_run(out: Path, model: nn.Module, plan: Plan, manifest: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """(meta, tensors) of RUN_DIR's checkpoint, its branch copied into the model; refuses a
    run of another plan or cache."""
    with safe_open(str(out / "branch.safetensors"), "pt") as f:
        info = f.metadata() or {}
    if info.get("format") != FORMAT:
        raise ValueError(f"{out}: not a {FORMAT} run")
    meta = json.loads(info["meta"])
    if meta["plan"] != json.loads(json.dumps(asdict(plan))):
        raise ValueError(f"{out}: the run was made with another plan; resume with the same plan")
    if meta["cache"] != manifest:
        raise ValueError(f"{out}: the run was made from another cache; resume with the same cache")
    tensors = load_file(str(out / "branch.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            if ".gla_branch." in n:
                p.copy_(tensors[n])
    return meta, tensors


def restore_adam(opt: torch.optim.Adam, tensors: dict[str, torch.Tensor], steps: dict[str, float]) -> None:
    for group in opt.param_groups:
        for name, p in zip(group["names"], group["params"]):
            if name in steps:
                opt.state[p] = {"step": torch.tensor(steps[name], dtype=torch.float32),
                                "exp_avg": tensors[f"adam.{name}.exp_avg"].clone(),
                                "exp_avg_sq": tensors[f"adam.{name}.exp_avg_sq"].clone()}


def train(model: nn.Module, cache: Path, plan: Plan, out: Path, layers: list[int], *, until: int | None = None,
          log: Callable[[str], None] = print, should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Train the branch of `layers` one after another from RUN_DIR's checkpoint (or the
    init), up to global step `until`; returns the run's meta."""
    manifest = read_manifest(cache, model, plan)
    if model.config.sinks + max(map(int, plan.windows)) >= plan.seq_len:
        raise ValueError(f"a window of {max(map(int, plan.windows))} leaves no position past it in {plan.seq_len} tokens")
    init = branch_tensors(model)
    tensors: dict[str, torch.Tensor] = {}
    meta = {"format": FORMAT, "plan": asdict(plan), "cache": manifest, "step": 0, "layers_done": [], "current": None,
            "tokens_seen": 0, "token_layers": 0, "seconds": 0.0}
    if (out / "branch.safetensors").exists():
        meta, tensors = load_run(out, model, plan, manifest)
        log(f"resumed at step {meta['step']}, layers done {meta['layers_done']}")
    todo = [i for i in layers if i not in meta["layers_done"]]
    if meta["current"] is not None and meta["current"]["layer"] in todo:  # a layer stopped midway goes first
        todo.remove(meta["current"]["layer"])
        todo.insert(0, meta["current"]["layer"])
    stop = lambda: should_stop() or (until is not None and meta["step"] >= until)  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.jsonl", "a") as logf:
        for i in todo:
            if stop() or not train_layer(model, i, cache, plan, out, meta, tensors, init, logf, log, stop):
                break
    return meta


def train_layer(model: nn.Module, i: int, cache: Path, plan: Plan, out: Path, meta: dict, tensors: dict[str, torch.Tensor],
                init: dict[str, torch.Tensor], logf, log: Callable[[str], None], stop: Callable[[], bool]) -> bool:  # noqa: ANN001
    """One layer, from its checkpointed step if it was stopped midway; False if stopped."""
    attn, c = model.blocks[i].attn, model.config
    slots, n = memory_slots_of(c, i), meta["cache"]["seqs"]["train"]
    opt = layer_optimizer(model, i, plan)
    cur = meta["current"] if meta["current"] is not None and meta["current"]["layer"] == i else None
    t0 = time.time()
    windows = [window_of(plan, i, j) for j in range(n)]
    parts = [layer_parts(attn, seq_path(cache, "train", j), i, windows[j], slots) for j in range(n)]
    held = [layer_parts(attn, seq_path(cache, "heldout", j), i, c.window, slots) for j in range(meta["cache"]["seqs"]["heldout"])]
    ram = sum(t.numel() * t.element_size() for p in parts for t in p.values()) / (n * plan.seq_len)
    if cur is None:
        cur = {"layer": i, "step": 0, "held_before": held_relative_mse(attn, held), "seconds": 0.0}
    else:
        restore_adam(opt, tensors, cur.get("adam_steps", {}))
    pre = time.time() - t0
    log(f"layer {i}: window parts of {n} sequences in {pre:.1f} s, {ram / 1024:.1f} KiB of RAM per token, "
        f"held-out rel MSE before {cur['held_before']:.4f}")
    meta["current"], total = cur, plan.epochs * n
    layer_base, run_base = cur["seconds"], meta["seconds"]  # what earlier processes spent

    def clock() -> float:
        """Seconds spent on this layer, this process's and earlier ones' (window parts included)."""
        elapsed = time.time() - t0
        cur["seconds"], meta["seconds"] = round(layer_base + elapsed, 1), round(run_base + elapsed, 1)
        return layer_base + elapsed

    while cur["step"] < total and not stop():
        epoch, k = divmod(cur["step"], n)
        j = order_of(plan, i, epoch, n)[k]
        for group in opt.param_groups:
            group["lr"] = (plan.lr if group["name"] == "maps_and_decay" else plan.mix_lr) * min(1.0, (cur["step"] + 1) / plan.warmup)
        opt.zero_grad(set_to_none=True)
        loss, rel = losses(attn, parts[j], c.sinks + windows[j])
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], plan.clip))
        opt.step()
        cur["step"] += 1
        meta.update(step=meta["step"] + 1, token_layers=meta["token_layers"] + plan.seq_len)
        meta["tokens_seen"] = meta["token_layers"] // c.n_layers
        rec = {"layer": i, "step": cur["step"], "seq": j, "window": windows[j], "loss": round(float(loss.detach()), 6),
               "rel_mse": round(rel, 5), "grad_norm": round(gnorm, 4), "seconds": round(clock(), 1)}
        logf.write(json.dumps(rec) + "\n")
        logf.flush()
        log(f"layer {i} step {cur['step']}/{total} W {windows[j]} loss {float(loss.detach()):.5f} rel_mse {rel:.4f} grad {gnorm:.3f}")
        if cur["step"] % plan.checkpoint_every == 0 or stop():
            save_run(out, model, opt, meta)
    if cur["step"] < total:
        return False
    after = held_relative_mse(attn, held)
    kept = after < cur["held_before"]
    if not kept:  # no better than its init on held-out text: the init goes back
        with torch.no_grad():
            for name, p in attn.gla_branch.named_parameters():
                p.copy_(init[f"blocks.{i}.attn.gla_branch.{name}"])
    seconds = clock()
    rate = total * plan.seq_len / seconds
    summary = {"layer": i, "done": True, "held_rel_mse_before": round(cur["held_before"], 5), "held_rel_mse_after": round(after, 5),
               "kept": kept, "steps": total, "seconds": round(seconds, 1), "window_parts_seconds": round(pre, 1),
               "ram_bytes_per_token": round(ram), "token_layers_per_s": round(rate, 1),
               "tokens_per_s_full_model": round(rate / c.n_layers, 2)}
    logf.write(json.dumps(summary) + "\n")
    logf.flush()
    log(f"layer {i} done: held-out rel MSE {cur['held_before']:.4f} -> {after:.4f} "
        f"({'kept' if kept else 'no better: init restored'}), {rate:.1f} token-layers/s = {rate / c.n_layers:.2f} tokens/s (full model)")
    meta["layers_done"].append(i)
    meta["current"] = None
    save_run(out, model, None, meta)
    return True


# ---- the command line -----------------------------------------------------------------------


def parse_layers(text: str, n_layers: int) -> list[int]:
    """"0-29", "3,5,7-9" -> the layers, in the order given."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"no layers {bad}: the model has {n_layers}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ca = sub.add_parser("cache", help="cache the teacher's per-layer inputs and targets")
    ca.add_argument("--corpus", type=Path, required=True, help="the corpus builder's folder (train.jsonl, heldout.jsonl)")
    ca.add_argument("--seqs", type=int, required=True)
    ca.add_argument("--heldout-seqs", type=int, required=True)
    ca.add_argument("--seq-len", type=int, help="default: the plan's")
    tr = sub.add_parser("train", help="train the branch layer by layer on a cache")
    tr.add_argument("--cache", type=Path, required=True)
    tr.add_argument("--layers", help="e.g. 0-29 or 3,5,7-9 (default: all)")
    tr.add_argument("--until", type=int, help="stop at this global step")
    for p in (ca, tr):
        p.add_argument("--model", type=Path, required=True, help="a laplace model directory")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--plan", type=Path, default=PLAN)
        p.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agent.runtime.checkpoint import load_model_dir

    plan = Plan.load(args.plan)
    lm = load_model_dir(args.model)
    model = lm.model.eval()
    try:
        if args.command == "cache":
            seq_len = args.seq_len or plan.seq_len
            eot = lm.tokenizer.token_id(EOT)
            kw = dict(seed=plan.seed, temperature=plan.temperature, multipliers=plan.multipliers)
            mixes = {s: SequenceMix(read_docs(args.corpus / f"{s}.jsonl"), lm.tokenizer.encode, eot, seq_len, **kw)
                     for s in ("train", "heldout")}
            written = build_cache(model, mixes, {"train": args.seqs, "heldout": args.heldout_seqs}, args.out,
                                  cache_identity(model, lm.name, plan, seq_len), log=lambda s: print(s, flush=True))
            print(f"{written} sequence files written to {args.out}", flush=True)
            return
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))  # finish the step, checkpoint, exit
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pid").write_text(f"{os.getpid()}\n")  # whom to SIGTERM: not the shell that launched it
        layers = parse_layers(args.layers or f"0-{model.config.n_layers - 1}", model.config.n_layers)
        meta = train(model, args.cache, plan, args.out, layers, until=args.until, log=lambda s: print(s, flush=True),
                     should_stop=lambda: stop["now"])
        print(f"stopped at step {meta['step']}, layers done {meta['layers_done']}; checkpoint in {args.out}", flush=True)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
