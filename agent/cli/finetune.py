"""`laplace finetune`: fine-tune a model on text, chat JSONL or exported sessions.

The command validates options, draws a progress bar, and records the finished run in the
session database; the training itself lives in `agent.train` (imported lazily, so other
commands do not pay for it). `--distributed` relaunches the same options under torchrun.

Mount with `app.command("finetune")(finetune_command)` in agent/cli/__init__.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from agent.cli.errors import fail as _fail
from agent.cli.store import settings_of
from agent.settings import Settings

DEFAULT_LORA_TARGETS = "v_proj,o_proj,w1,w2,w3"  # agent.train.lora.DEFAULT_TARGETS (not imported: it pulls in torch)



def record_run(settings: Settings, summary: dict[str, Any]) -> None:
    """Add the run to the database; a failure here only warns (metrics.jsonl has it all)."""
    try:
        from sessions.store import SessionStore

        settings.ensure_home()
        with SessionStore.open(settings.db_path) as store:
            store.browse.add_finetune_run(model_id=summary["base"], kind=f"finetune-{summary['tune']}", payload=summary)
    except Exception as exc:  # the run itself succeeded; never lose it to a DB problem
        typer.echo(f"warning: could not record the run in {settings.db_path} ({exc}); see {summary['out']}/metrics.jsonl", err=True)


def finetune_command(
    ctx: typer.Context,
    data: list[Path] = typer.Argument(..., help="Text files or folders, JSONL chat, or `laplace sessions export --format json` files."),
    model: str = typer.Option("default", "-m", "--model", help="Base model: directory, user model name or preset."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory: a model directory `laplace chat -m` loads."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps."),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="Training tokens (instead of --steps)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence, a multiple of the chunk (default 16 chunks)."),
    batch_tokens: Optional[int] = typer.Option(None, "--batch-tokens", help="Tokens per step (default 4 sequences)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Sequences per forward/backward (default: as many as fit; the default model: 1, with grad accumulation)."),
    recompute: bool = typer.Option(True, "--recompute/--no-recompute", help="Rebuild each block's activations in backward: ~1/3 more compute, a fraction of the memory."),
    lr: float = typer.Option(3e-4, "--lr", help="Learning rate of both optimizers (Muon matches AdamW's update RMS)."),
    muon_lr: Optional[float] = typer.Option(None, "--muon-lr", help="Muon learning rate (default --lr)."),
    adamw_lr: Optional[float] = typer.Option(None, "--adamw-lr", help="AdamW learning rate (default --lr)."),
    weight_decay: float = typer.Option(0.0, "--weight-decay"),
    schedule: str = typer.Option("wsd", "--schedule", help="wsd | cosine | constant."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Warmup steps (default 5%, at most 100)."),
    clip: float = typer.Option(1.0, "--clip", help="Gradient-norm clip (0: off)."),
    optimizer: str = typer.Option("muon", "--optimizer", help="muon (Muon + AdamW) | adamw."),
    eval_data: Optional[list[Path]] = typer.Option(None, "--eval", help="Held-out data for eval loss (repeatable)."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue a run: its output directory (the newest checkpoint) or one step-NNNNNN checkpoint."),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Steps between numbered checkpoints, OUT/step-NNNNNN (default: only at the end)."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", help="Stop at this step with a checkpoint to --resume; the schedule stays that of --steps."),
    keep: int = typer.Option(3, "--keep", help="Numbered checkpoints to keep (the newest)."),
    tune: str = typer.Option("all", "--tune", help="all: every weight | state: only a learned initial state | lora: low-rank adapters, saved as OUT/delta.safetensors beside the merged model."),
    lora_rank: int = typer.Option(8, "--lora-rank", help="--tune lora: adapter rank."),
    lora_alpha: float = typer.Option(16.0, "--lora-alpha", help="--tune lora: the update is alpha / rank * B A."),
    lora_targets: str = typer.Option(DEFAULT_LORA_TARGETS, "--lora-targets", help="--tune lora: comma-separated linears to adapt (q_proj, k_proj, v_proj, o_proj, gate_proj, w1, w2, w3)."),
    lora_ranks: str = typer.Option("", "--lora-ranks", help="--tune lora: per-target ranks over --lora-rank, e.g. q_proj=64,k_proj=64 (each target also in --lora-targets)."),
    init_lora: Optional[Path] = typer.Option(None, "--init-lora", help="--tune lora: start from this lora delta's adapters (e.g. an earlier run's OUT/delta.safetensors); targets it lacks start fresh."),
    pack: str = typer.Option("stream", "--pack", help="stream: documents run on across rows | rows: each document starts a row (padding is never trained)."),
    on_bad: str = typer.Option("skip", "--on-bad", help="skip | error: what to do with bad data records."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda | neuron (default: settings)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 (bf16 autocast where a start-up check finds it fast: GPU, Trainium, a CPU with fast bf16 matmuls)."),
    seed: int = typer.Option(0, "--seed"),
    distributed: bool = typer.Option(False, "--distributed", help="Run under torchrun with FSDP2 + distributed Muon."),
    nproc: int = typer.Option(2, "--nproc-per-node", help="Processes for --distributed."),
) -> None:
    """Fine-tune a model (Muon on block matrices, AdamW on the rest) and save a model directory."""
    from agent.runtime.checkpoint import ModelLoadError
    from agent.runtime.device import DeviceUnavailableError
    from agent.runtime.state import StateError
    from agent.train.checkpoint import ResumeError
    from agent.train.config import TrainConfig, TrainConfigError
    from agent.train.data import DataError

    settings = settings_of(ctx)
    try:
        cfg = TrainConfig(
            data=tuple(str(d) for d in data), out=str(out), base=model, steps=steps, tokens=tokens, seq_len=seq_len,
            batch_tokens=batch_tokens, micro_batch=micro_batch, recompute=recompute, lr=lr, muon_lr=muon_lr, adamw_lr=adamw_lr,
            weight_decay=weight_decay, schedule=schedule, warmup=warmup, clip=clip, optimizer=optimizer,
            eval=tuple(str(e) for e in eval_data or ()), eval_every=eval_every, resume=str(resume) if resume else None,
            save_every=save_every, stop_after=stop_after, keep=keep, tune=tune, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_targets=lora_targets, lora_ranks=lora_ranks, init_lora=str(init_lora) if init_lora else None, pack=pack, on_bad=on_bad, device=device or settings.device,
            dtype=dtype, seed=seed, distributed=distributed,
        )
    except TrainConfigError as exc:
        raise _fail(str(exc)) from None
    from agent.cli.models import ensure_model

    ensure_model(settings, model)
    if distributed:
        _launch_torchrun(cfg, nproc, settings)
        return
    from agent.train.loop import Trainer

    with _Progress() as progress:
        trainer = Trainer(
            cfg, models_dir=settings.models_dir, on_log=progress.log, on_step=progress.update,
            on_finished=lambda s: record_run(settings, s),
        )
        try:
            summary = trainer.run()
        except (TrainConfigError, DataError, ResumeError, ModelLoadError, DeviceUnavailableError, StateError, FileNotFoundError) as exc:
            raise _fail(str(exc)) from None
    _print_summary(summary)


def _launch_torchrun(cfg: Any, nproc: int, settings: Settings) -> None:
    from agent.train.__main__ import config_to_argv

    if nproc < 1:
        raise _fail("--nproc-per-node must be at least 1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), "-m", "agent.train",
           *config_to_argv(cfg, settings.models_dir)]
    typer.echo("running: " + " ".join(cmd), err=True)
    rc = subprocess.call(cmd)
    summary_path = Path(cfg.out) / "summary.json"
    if rc != 0 or not summary_path.is_file():
        raise _fail(f"distributed run failed (exit code {rc}); see the output above")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    record_run(settings, summary)
    _print_summary(summary)


def _print_summary(s: dict[str, Any]) -> None:
    ev = f", eval loss {s['eval_loss_start']:.4f} -> {s['eval_loss']:.4f}" if s.get("eval_loss") is not None and s.get("eval_loss_start") is not None else ""
    what = {"state": "initial state", "lora": "LoRA delta (delta.safetensors) and merged model"}.get(s["tune"], "model")
    loss = f"loss {s['final_loss']:.4f}" if s.get("final_loss") is not None else "no new steps"
    if s.get("completed", True):
        typer.echo(f"trained {s['steps']} steps, {s['tokens']:,} tokens, {loss}{ev}; {what} saved in {s['out']}")
    else:
        typer.echo(f"stopped at step {s['steps']} of {s['total_steps']}, {s['tokens']:,} tokens, {loss}{ev}; {what} saved in "
                   f"{s['out']}; continue with --resume {s['out']}")


class _Progress:
    """A rich progress bar fed by the trainer's on_step callback."""

    def __enter__(self) -> "_Progress":
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("finetune"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn(), transient=False, redirect_stdout=False)
        self.bar.__enter__()
        self.task = None
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)  # type: ignore[arg-type]

    def log(self, msg: str) -> None:
        from agent.display import displayable

        # Messages quote file names and records: show their control characters, never run them.
        self.bar.console.print(displayable(msg), markup=False, highlight=False)

    def update(self, m: dict[str, Any]) -> None:
        if self.task is None:
            self.task = self.bar.add_task("finetune", total=m["total_steps"], completed=m["step"] - 1, info="")
        ev = f" eval {m['eval_loss']:.3f}" if m.get("eval_loss") is not None else ""
        info = f"{m['tokens_per_s']:,.0f} tok/s  loss {m['loss']:.3f}{ev}  lr {m['lr']:.1e}"
        self.bar.update(self.task, completed=m["step"], info=info)

