"""`python -m agent.train` / `torchrun --nproc-per-node N -m agent.train`: the trainer
without the Typer CLI, for clusters. Rank 0 prints progress lines and writes the output
directory; every rank runs the same code (FSDP2 + distributed Muon when WORLD_SIZE > 1).

`config_to_argv` is the inverse of `parse_config`, so `laplace finetune --distributed`
can launch torchrun with exactly the options it validated.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from agent.train.config import TrainConfig, TrainConfigError

def _on_off(value: str) -> bool:
    if value.lower() in ("on", "true", "1", "yes"):
        return True
    if value.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


# (flag, TrainConfig field, type, help)
_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--model", "base", str, "base model: a model directory, a user model name or a preset"),
    ("--out", "out", str, "output directory (model files, metrics.jsonl, trainer state)"),
    ("--steps", "steps", int, "optimizer steps"),
    ("--tokens", "tokens", int, "training tokens (instead of --steps)"),
    ("--seq-len", "seq_len", int, "tokens per sequence; a multiple of the model's chunk size"),
    ("--batch-tokens", "batch_tokens", int, "tokens per optimizer step (all ranks together)"),
    ("--micro-batch", "micro_batch", int, "sequences per forward/backward on each rank"),
    ("--recompute", "recompute", _on_off, "on | off: rebuild each block's activations in backward (default on; off is faster and needs far more memory)"),
    ("--lr", "lr", float, "learning rate of both optimizers"),
    ("--muon-lr", "muon_lr", float, "Muon learning rate (default: --lr)"),
    ("--adamw-lr", "adamw_lr", float, "AdamW learning rate (default: --lr)"),
    ("--muon-adjust", "muon_adjust", str, "match_rms_adamw | original | none"),
    ("--weight-decay", "weight_decay", float, "decoupled weight decay"),
    ("--schedule", "schedule", str, "wsd | cosine | constant"),
    ("--warmup", "warmup", int, "warmup steps"),
    ("--decay-fraction", "decay_fraction", float, "share of steps in the WSD decay"),
    ("--clip", "clip", float, "gradient-norm clip (0: off)"),
    ("--optimizer", "optimizer", str, "muon (Muon + AdamW) | adamw (AdamW only)"),
    ("--tune", "tune", str, "all | state | lora"),
    ("--lora-rank", "lora_rank", int, "--tune lora: adapter rank"),
    ("--lora-alpha", "lora_alpha", float, "--tune lora: adapter scale alpha (the update is alpha / rank * B A)"),
    ("--lora-targets", "lora_targets", str, "--tune lora: comma-separated linears to adapt"),
    ("--lora-ranks", "lora_ranks", str, "--tune lora: per-target ranks over --lora-rank, e.g. q_proj=64,k_proj=64"),
    ("--init-lora", "init_lora", str, "--tune lora: start from this lora delta's adapters (others start fresh)"),
    ("--pack", "pack", str, "stream | rows: whether each document starts a new row"),
    ("--eval-every", "eval_every", int, "steps between evaluations"),
    ("--eval-rows", "eval_rows", int, "eval sequences at most"),
    ("--resume", "resume", str, "continue the run in this output directory"),
    ("--save-every", "save_every", int, "steps between checkpoints"),
    ("--stop-after", "stop_after", int, "stop with a checkpoint after this many steps (the schedule stays --steps')"),
    ("--keep", "keep", int, "numbered checkpoints to keep, newest first"),
    ("--on-bad", "on_bad", str, "skip | error: what to do with bad data records"),
    ("--device", "device", str, "auto | cpu | cuda | neuron"),
    ("--dtype", "dtype", str, "float32 | bfloat16 (where a start-up check finds bf16 fast)"),
    ("--seed", "seed", int, "data-order seed"),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.train", description="Fine-tune a Laplace model (torchrun-ready).")
    p.add_argument("data", nargs="+", help="text files or folders, JSONL chat, session exports")
    for flag, field, typ, help_ in _OPTIONS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=help_, **({"required": True} if field == "out" else {}))
    p.add_argument("-m", dest="base", type=str, default=None, help=argparse.SUPPRESS)
    p.add_argument("--eval", dest="eval", action="append", default=None, help="held-out data (repeatable)")
    p.add_argument("--models-dir", default=None, help="where user models live")
    return p


def parse_config(argv: list[str]) -> tuple[TrainConfig, Path | None]:
    ns = vars(build_parser().parse_args(argv))
    models_dir = Path(ns.pop("models_dir")) if ns.get("models_dir") else None
    fields = {k: v for k, v in ns.items() if v is not None}
    fields["data"] = tuple(fields["data"])
    fields["eval"] = tuple(fields.get("eval") or ())
    fields["distributed"] = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return TrainConfig(**fields), models_dir


def config_to_argv(cfg: TrainConfig, models_dir: Path | None = None) -> list[str]:
    defaults = TrainConfig(data=cfg.data, out=cfg.out, steps=1)
    argv = list(cfg.data)
    for flag, field, _, _ in _OPTIONS:
        value = getattr(cfg, field)
        if field in ("out", "base") or (value is not None and value != getattr(defaults, field)) or field in ("steps", "tokens"):
            if value is not None:
                argv += [flag, str(value)]
    for e in cfg.eval:
        argv += ["--eval", e]
    if models_dir is not None:
        argv += ["--models-dir", str(models_dir)]
    return argv


def main(argv: list[str] | None = None) -> int:
    from agent.runtime.checkpoint import ModelLoadError
    from agent.runtime.device import DeviceUnavailableError
    from agent.runtime.state import StateError
    from agent.train.checkpoint import ResumeError
    from agent.train.data import DataError
    from agent.train.loop import Trainer

    try:
        cfg, models_dir = parse_config(sys.argv[1:] if argv is None else argv)
    except TrainConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    def on_step(m: dict[str, Any]) -> None:
        ev = f" eval {m['eval_loss']:.4f}" if m.get("eval_loss") is not None else ""
        print(f"step {m['step']}/{m['total_steps']} loss {m['loss']:.4f}{ev} lr {m['lr']:.2e} {m['tokens_per_s']:,.0f} tok/s", flush=True)

    try:
        Trainer(cfg, models_dir=models_dir, on_log=lambda s: print(s, flush=True), on_step=on_step).run()
    except (TrainConfigError, DataError, ResumeError, ModelLoadError, DeviceUnavailableError, StateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
