"""The training loop: chunked GLA through `model.forward` with autograd, Muon + AdamW,
warmup + WSD/cosine, clipping, evaluation, checkpoints, exact resume; one process or
FSDP2 under torchrun.

Callbacks keep this module free of UI and database code: `on_log(str)` for messages,
`on_step(metrics)` after every step (the CLI draws its progress bar from it), and
`on_finished(summary)` once at the end (the CLI records the run in the database).
Only rank 0 calls them and writes files.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute

from agent.runtime.checkpoint import LoadedModel, load_model, load_model_dir, save_model_dir
from agent.runtime.delta import read_delta, write_delta
from agent.runtime.device import has_fast_bf16, parse_dtype, resolve_device
from agent.runtime.model import build_model
from agent.runtime.state import tensor_bytes
from agent.train import checkpoint as ckpt
from agent.train.config import TrainConfig, TrainConfigError
from agent.train.data import IGNORE_INDEX, PackedData, load_documents, pack, pad_token, trim_untrained_tail
from agent.train.distributed import DistInfo, all_reduce_sum, init_distributed, shard_model
from agent.train.initial_state import INITIAL_STATE_FILE, InitialState, save_initial_state
from agent.train.memory import FIT_MARGIN, LOSS_CHUNK, MemoryEstimate, available_bytes, default_micro_batch, enable_recompute, estimate_run, fit_advice
from agent.train.lora import LoRALinear, attach_lora, load_lora_delta, lora_delta, merged_state_dict
from agent.train.optim import ParamSplit, build_optimizers, lr_factor, set_learning_rates, split_parameters

METRICS_FILE = "metrics.jsonl"
LORA_DELTA_FILE = "delta.safetensors"  # --tune lora: the adapters as a "lora" delta (agent/runtime/delta.py)
SUMMARY_FILE = "summary.json"


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        *,
        base: LoadedModel | None = None,
        models_dir: Path | None = None,
        on_log: Callable[[str], None] | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_finished: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.models_dir = models_dir
        self._base = base
        self._on_log, self._on_step, self._on_finished = on_log, on_step, on_finished
        self.out = Path(cfg.out)
        self.comm_log: list[dict[str, int]] = []
        self.history: list[dict[str, Any]] = []

    def log(self, msg: str) -> None:
        if self.info.is_main and self._on_log:
            self._on_log(msg)

    # ---- setup --------------------------------------------------------------------------

    def _setup(self) -> None:
        cfg = self.cfg
        self.device = resolve_device(cfg.device)
        self.dtype = parse_dtype(cfg.dtype)
        if self.dtype != torch.float32 and not has_fast_bf16(self.device):
            raise TrainConfigError(f"--dtype {cfg.dtype} is only fast on GPU/Trainium; on {self.device.type} train in float32")
        self.info = init_distributed(self.device) if cfg.distributed else DistInfo()
        if self.info.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.info.rank % torch.cuda.device_count())
        base = self._base or load_model(cfg.base, device="cpu", models_dir=self.models_dir)
        self.base = base
        self.base_fingerprint = base.fingerprint
        c = base.config
        self.seq_len = cfg.seq_len or 16 * c.chunk_size
        if self.seq_len % c.chunk_size:
            raise TrainConfigError(f"--seq-len {self.seq_len} must be a multiple of the model's chunk size {c.chunk_size}")
        batch_tokens = cfg.batch_tokens or 4 * self.seq_len
        if batch_tokens % self.seq_len:
            raise TrainConfigError(f"--batch-tokens {batch_tokens} must be a multiple of --seq-len {self.seq_len}")
        self.rows_per_step = batch_tokens // self.seq_len
        if self.rows_per_step % self.info.world:
            raise TrainConfigError(f"{self.rows_per_step} sequences per step do not split over {self.info.world} ranks")
        self.micro = cfg.micro_batch or self._default_micro(self.rows_per_step // self.info.world)
        self._check_memory()
        self.total_steps = cfg.steps or math.ceil(cfg.tokens / batch_tokens)  # type: ignore[operator]
        self.warmup = cfg.warmup if cfg.warmup is not None else min(100, self.total_steps // 20)
        self.eval_every = cfg.eval_every or max(1, self.total_steps // 10)

        docs, report = load_documents(list(cfg.data), base.tokenizer, base.template, on_bad=cfg.on_bad)
        for bad in report.bad[:20]:
            self.log(f"skipped bad record {bad}")
        if len(report.bad) > 20:
            self.log(f"... and {len(report.bad) - 20} more bad records")
        self.data_report = report
        pad = pad_token(base.tokenizer)
        align = cfg.pack == "rows"
        self.data = pack(docs, self.seq_len, pad, align=align)
        self.data_digest = hashlib.sha256(tensor_bytes(self.data.tokens)).hexdigest()
        self.eval_data: PackedData | None = None
        if cfg.eval:
            eval_docs, _ = load_documents(list(cfg.eval), base.tokenizer, base.template, on_bad=cfg.on_bad)
            self.eval_data = pack(eval_docs, self.seq_len, pad, align=align)
        self.log(f"data: {report.summary()} -> {len(self.data)} sequences of {self.seq_len}")

        self.resume_doc: dict[str, Any] | None = None
        self.resume_dir: Path | None = None
        if cfg.resume:
            self.resume_dir = ckpt.resolve_resume(cfg.resume)
            self.resume_doc = ckpt.read_trainer_state(self.resume_dir)
            ckpt.check_same_base(self.resume_doc, resume=cfg.resume, config=c.to_dict(), fingerprint=self.base_fingerprint, name=base.name, tune=cfg.tune)
            if self.resume_doc.get("data_digest") != self.data_digest:
                self.log("warning: the data differs from the checkpointed run; the continuation will not match it exactly")
        elif (self.out / ckpt.TRAINER_DIR / ckpt.STATE_FILE).exists() or ckpt.numbered_checkpoints(self.out):
            raise TrainConfigError(f"{self.out} already holds a finetune run; pass --resume {self.out} to continue it, or choose another --out")
        self._build_model()

    def _estimate(self, micro: int) -> MemoryEstimate:
        """This run's peak memory estimate (agent/train/memory.py) at `micro` rows per pass."""
        cfg = self.cfg
        return estimate_run(self.base.model, self.base.config, tune=cfg.tune, muon=cfg.optimizer == "muon", lora_rank=cfg.lora_rank_of,
                            lora_targets=cfg.lora_target_names, seq_len=self.seq_len, micro=micro, recompute=self._recompute,
                            copied=self._base is not None and cfg.tune != "state", chunked_loss=self.info.world == 1)

    @property
    def _recompute(self) -> bool:
        """--recompute, except on a caller's own model (`--tune state` trains beside it, not a
        copy of it): its blocks' forward is never replaced behind the caller's back."""
        return self.cfg.recompute and not (self.cfg.tune == "state" and self._base is not None)

    def _default_micro(self, rows: int) -> int:
        return default_micro_batch(rows, self._estimate)

    def _check_memory(self) -> None:
        """Refuse, before any data is read, a run whose estimated peak exceeds the memory
        available (one line: what it needs, what there is, the way out)."""
        est = self._estimate(self.micro)
        self.memory_estimate = est
        if self.device.type != "cpu":
            return  # accelerator memory is the device's; its own allocator reports a shortfall
        avail = available_bytes()
        if avail is not None and est.total > FIT_MARGIN * avail:
            raise TrainConfigError(
                f"this run needs {est.describe()} but {avail / 2**30:.1f} GB is available; way out: "
                f"{fit_advice(est, seq_len=self.seq_len, micro=self.micro, recompute=self.cfg.recompute, tune=self.cfg.tune)}")

    def _init_lora(self, path: str) -> None:
        """Start the adapters from an earlier run's "lora" delta (--init-lora); targets it has
        no pair for start fresh. A file that does not fit is one TrainConfigError."""
        try:
            tensors, _ = read_delta(path, formats=("lora",))
            loaded = load_lora_delta(self.adapters, tensors, partial=True)
        except (OSError, ValueError) as exc:  # DeltaError is a ValueError
            raise TrainConfigError(f"--init-lora {path}: {exc}") from None
        fresh = len(self.adapters) - len(loaded)
        self.log(f"LoRA: {len(loaded)} adapters from {path}, {fresh} start fresh")

    def _build_model(self) -> None:
        cfg = self.cfg
        self.adapters: dict[str, LoRALinear] = {}
        if cfg.tune == "lora":
            model = self._private_copy()
            self.adapters = attach_lora(model, targets=cfg.lora_target_names, rank=cfg.lora_rank, alpha=cfg.lora_alpha, seed=cfg.seed,
                                        ranks=cfg.lora_rank_of)
            if self.resume_doc is not None:
                tensors, _ = read_delta(self.resume_dir / LORA_DELTA_FILE)  # type: ignore[operator]
                load_lora_delta(self.adapters, tensors)
            elif cfg.init_lora is not None:
                self._init_lora(cfg.init_lora)
            model = model.to(self.device).train()
            self.initial = None
            trainable: nn.Module = model
            # AdamW for the adapters: they are not block matrices (agent.runtime.params), and
            # B starts at zero, where Muon's orthogonalized step has no scale to follow.
            split = split_parameters(model, use_muon=cfg.optimizer == "muon")
            names = {n: p for n, p in model.named_parameters() if p.requires_grad}
        elif cfg.tune == "all":
            if self.resume_doc is not None:
                model = load_model_dir(self.resume_dir, device="cpu").model  # type: ignore[arg-type]
            else:
                model = self._private_copy()
            model = model.to(self.device).train()
            self.initial: InitialState | None = None
            if self.info.enabled:
                model = shard_model(model, self.info)
            trainable = model
            split = split_parameters(model, use_muon=cfg.optimizer == "muon")
            names = dict(model.named_parameters())
        else:
            model = self.base.model.to(self.device).eval()
            model.requires_grad_(False)
            start = model.new_state(1)
            if self.resume_doc is not None:
                from agent.train.initial_state import load_initial_state

                start = load_initial_state(self.resume_dir / INITIAL_STATE_FILE, self.base, device=self.device)  # type: ignore[operator]
            self.initial = InitialState(start).to(self.device)
            trainable = self.initial
            split = ParamSplit(muon=[], adamw=list(self.initial.named_parameters()))
            names = dict(self.initial.named_parameters())
        if self._recompute:
            enable_recompute(model)
        self.model, self.split = model, split
        self.param_names = {id(p): n for n, p in names.items()}
        self.params_by_name = names
        self.trainable = trainable
        self.opts = build_optimizers(
            split, muon_lr=cfg.muon_base_lr, adamw_lr=cfg.adamw_base_lr, weight_decay=cfg.weight_decay,
            muon_adjust=cfg.muon_adjust, device=self.device, process_group=self.info.group, comm_log=self.comm_log,
        )
        self.start_step, self.tokens_seen = 0, 0
        if self.resume_doc is not None:
            ckpt.load_optimizer_state(self.opts, ckpt.read_optimizer_file(self.resume_dir), names)  # type: ignore[arg-type]
            self.start_step = int(self.resume_doc["step"])
            self.tokens_seen = int(self.resume_doc["tokens"])
            self.log(f"resumed {self.resume_dir} at step {self.start_step} ({self.tokens_seen:,} tokens); learning rates from this command line")
            if cfg.stop_after is not None and cfg.stop_after <= self.start_step:
                raise TrainConfigError(f"--stop-after {cfg.stop_after} is not after the resumed step {self.start_step}; give a later step")
        if cfg.tune == "lora":
            ranks = f"rank {cfg.lora_rank}" + (f", {cfg.lora_ranks}" if cfg.lora_ranks else "")
            self.log(f"LoRA: {split.adamw_numel:,} adapter parameters ({ranks} on {len(self.adapters)} linears: "
                     f"{cfg.lora_targets}) trained with AdamW; the base weights are frozen")
        else:
            self.log(split.describe())

    def _private_copy(self) -> nn.Module:
        """A private fp32 copy of the base model: the caller's model stays untouched. A base
        this trainer loaded itself is private already, and is used as it is (in fp32): a
        second copy of the weights would cost as much memory as the grads."""
        if self._base is None:
            return self.base.model.float()
        model = build_model(self.base.config, device="meta")
        weights = {k: v.detach().to("cpu", torch.float32).clone() for k, v in self.base.model.state_dict().items()}
        model.load_state_dict(weights, strict=True, assign=True)
        return model

    # ---- steps --------------------------------------------------------------------------

    def autocast(self) -> Any:
        """The autocast context for a forward pass at the run's dtype (none in fp32)."""
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def loss_sum(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of one micro-batch over its trained (non-ignored) labels.

        The hook a subclass overrides to weight tokens differently (recipes/weighted.py);
        `train_step` normalizes the sum by the step's trained tokens, `evaluate` by the split's.
        """
        state = self.initial.expand(inputs.shape[0]) if self.initial is not None else None
        labels = labels.to(self.device)
        if self.info.world > 1 or not torch.is_grad_enabled() or inputs.shape[1] <= LOSS_CHUNK:
            # FSDP2 unshards the root's parameters (the head's) only around forward(); an
            # evaluation keeps no graph, so the whole logits are freed at once anyway; a row
            # of one chunk would save nothing (and the whole path keeps the gradient sums'
            # order, which the single- vs multi-process test holds to 1e-4).
            with self.autocast():
                logits, _ = self.model(inputs.to(self.device), state)
            return _cross_entropy_sum(logits, labels)
        with self.autocast():
            hidden, _ = self.model(inputs.to(self.device), state, head=False)
        # The logits a LOSS_CHUNK of positions at a time, rebuilt in backward: the full
        # [B, T, vocab] logits, their log-softmax and grads would be ~0.8 GB per 1,024-token
        # row on a 49k vocabulary; a chunk's are a quarter of that, and only one lives at once.
        total = hidden.new_zeros((), dtype=torch.float32)
        for t0 in range(0, hidden.shape[1], LOSS_CHUNK):
            total = total + recompute(self._chunk_loss, hidden[:, t0 : t0 + LOSS_CHUNK],
                                       labels[:, t0 : t0 + LOSS_CHUNK], use_reentrant=False)
        return total

    def _chunk_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = self.model.head(hidden)
        return _cross_entropy_sum(logits, labels)

    def train_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        factor = lr_factor(step, self.total_steps, schedule=self.cfg.schedule, warmup=self.warmup, decay_fraction=self.cfg.decay_fraction)
        set_learning_rates(self.opts, factor)
        rows = self.data.row_order(step, self.rows_per_step, self.cfg.seed)
        _, all_labels = self.data.rows(rows)
        # Normalize by the step's trained tokens over *all* ranks (known without talking:
        # every rank holds the data); x world because FSDP2 averages gradients over ranks.
        n_trained = int((all_labels != IGNORE_INDEX).sum())
        scale = self.info.world / max(1, n_trained)
        local = rows[self.info.rank :: self.info.world]
        loss_sum = 0.0
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        for i in range(0, len(local), self.micro):
            inputs, labels = trim_untrained_tail(*self.data.rows(local[i : i + self.micro]))
            loss = self.loss_sum(inputs, labels)
            (loss * scale).backward()
            loss_sum += float(loss.detach())
        params = [p for p in self.trainable.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip if self.cfg.clip > 0 else float("inf"))
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        t_opt = time.perf_counter()
        for opt in self.opts:
            opt.step()
        t_end = time.perf_counter()
        (loss_total,) = all_reduce_sum([loss_sum], self.info)
        step_tokens = self.rows_per_step * self.seq_len
        self.tokens_seen += step_tokens
        return {
            "step": step + 1, "tokens": self.tokens_seen, "loss": loss_total / max(1, n_trained),
            "lr": self.opts[0].param_groups[0]["lr"], "grad_norm": grad_norm,
            "step_s": t_end - t0, "optimizer_s": t_end - t_opt, "tokens_per_s": step_tokens / (t_end - t0),
        }

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss per trained token over (at most eval_rows of) the eval data. Every rank
        evaluates the same rows, so FSDP2's collectives stay in step."""
        if self.eval_data is None:
            return None
        was_training = self.model.training
        self.model.eval()
        n = min(len(self.eval_data), self.cfg.eval_rows)
        total, count = 0.0, 0
        for i in range(0, n, self.micro):
            inputs, labels = trim_untrained_tail(*self.eval_data.rows(torch.arange(i, min(n, i + self.micro))))
            total += float(self.loss_sum(inputs, labels))
            count += int((labels != IGNORE_INDEX).sum())
        self.model.train(was_training)
        return total / max(1, count)

    # ---- checkpoints --------------------------------------------------------------------

    def save(self, step: int, *, numbered: bool) -> Path:
        """Write the run at `step`: into the output directory itself (the finished run), or
        as the numbered checkpoint `step-NNNNNN/` (written aside, then renamed into place,
        and the oldest beyond --keep deleted). Returns the directory."""
        cfg = self.cfg
        final = self.out / ckpt.checkpoint_name(step) if numbered else self.out
        target = self.out / f".{ckpt.checkpoint_name(step)}.partial" if numbered else self.out
        if self.info.is_main:
            if numbered and target.exists():
                shutil.rmtree(target)  # left by a crash mid-save
            target.mkdir(parents=True, exist_ok=True)
        self._write(target, step)
        if numbered and self.info.is_main:
            if final.exists():
                shutil.rmtree(final)
            target.rename(final)
            for old in ckpt.prune_checkpoints(self.out, cfg.keep):
                self.log(f"removed old checkpoint {old.name} (--keep {cfg.keep})")
        return final

    def _write(self, target: Path, step: int) -> None:
        cfg = self.cfg
        card = {**self.base.card, "name": self.out.name, "base": self.base.name, "base_fingerprint": self.base_fingerprint,
                "finetune_steps": step, "finetune_tokens": self.tokens_seen, "trained": True}
        card.pop("synthesized_parameters", None)  # an import's made-up constants are trained from here on
        if cfg.tune == "lora":
            # The delta is the product; the merged model beside it keeps OUT loadable as is.
            plain = build_model(self.base.config, device="meta")
            plain.load_state_dict(merged_state_dict(self.model, self.adapters), strict=True, assign=True)
            save_model_dir(LoadedModel(plain, self.base.tokenizer, self.base.template, name=self.out.name), target,
                           card={**card, "lora": {"rank": cfg.lora_rank, "ranks": cfg.lora_rank_of, "alpha": cfg.lora_alpha,
                                                  "targets": list(cfg.lora_target_names)}})
            write_delta(target / LORA_DELTA_FILE, lora_delta(self.adapters), "lora",
                        {"base": self.base.name, "base_fingerprint": self.base_fingerprint, "rank": str(cfg.lora_rank),
                         **({"ranks": cfg.lora_ranks} if cfg.lora_ranks else {}),
                         "alpha": str(cfg.lora_alpha), "targets": cfg.lora_targets, "steps": str(step)})
        elif cfg.tune == "all":
            weights = ckpt.full_state_dict(self.model)
            if self.info.is_main:
                plain = build_model(self.base.config, device="meta")
                plain.load_state_dict(weights, strict=True, assign=True)
                save_model_dir(LoadedModel(plain, self.base.tokenizer, self.base.template, name=self.out.name), target, card=card)
        elif self.info.is_main:
            assert self.initial is not None
            save_initial_state(self.initial.to_state(), target / INITIAL_STATE_FILE, fingerprint=self.base_fingerprint,
                               extra={"base": self.base.name, "steps": str(step)})
        meta = {"step": step, "tokens": self.tokens_seen, "tune": cfg.tune, "world": self.info.world, "data_digest": self.data_digest,
                "base": {"name": self.base.name, "fingerprint": self.base_fingerprint, "config": self.base.config.to_dict()},
                "train_config": cfg.to_dict()}
        ckpt.save_trainer_state(target, self.info, opts=self.opts, names=self.param_names, meta=meta)

    # ---- run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t_start = time.perf_counter()
        self._setup()
        cfg = self.cfg
        metrics_path = self.out / METRICS_FILE
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            if self.resume_doc is not None:
                self._rewind(metrics_path)
        eval_start = self.evaluate()
        if eval_start is not None:
            self.log(f"eval loss before training: {eval_start:.4f}")
        last_eval = eval_start
        end = self.total_steps if cfg.stop_after is None else min(self.total_steps, cfg.stop_after)
        step = self.start_step
        for step in range(self.start_step, end):
            m = self.train_step(step)
            done = step + 1
            if done % self.eval_every == 0 or done == self.total_steps:
                last_eval = self.evaluate()
                m["eval_loss"] = last_eval
            self.history.append(m)
            if self.info.is_main:
                with metrics_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(m) + "\n")
                if self._on_step:
                    self._on_step({**m, "total_steps": self.total_steps})
            if cfg.save_every and done % cfg.save_every == 0 and done != end:
                self.save(done, numbered=True)
        final_step = max(step + 1, self.start_step) if end > self.start_step else self.start_step
        # The output directory always holds the latest model, finished or stopped early
        # (--stop-after), so `laplace chat -m OUT` and `--resume OUT` both take it as it is.
        saved = self.save(final_step, numbered=False)
        summary = {**self._summary(final_step, eval_start, last_eval, time.perf_counter() - t_start), "checkpoint": str(saved)}
        if self.info.is_main:
            # Also on disk, so a launcher of `torchrun -m agent.train` can read the outcome.
            (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
            if self._on_finished:
                self._on_finished(summary)
        return summary

    def _rewind(self, metrics_path: Path) -> None:
        """Resuming from an earlier step: set later checkpoints aside and drop their metrics
        lines, so the output directory describes one consistent run."""
        here = self.resume_dir.resolve()  # type: ignore[union-attr]
        if self.out.resolve() in (here, here.parent):
            for name in ckpt.set_aside_later(self.out, self.start_step):
                self.log(f"set aside {name}: it continued from a later step than this resume")
        if metrics_path.is_file():
            lines = metrics_path.read_text(encoding="utf-8").splitlines()
            kept = [x for x in lines if x.strip() and json.loads(x).get("step", 0) <= self.start_step]
            if len(kept) != len(lines):
                metrics_path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")

    def _summary(self, step: int, eval_start: float | None, eval_end: float | None, wall: float) -> dict[str, Any]:
        h = self.history
        steps_s = sum(m["step_s"] for m in h)
        opt_s = sum(m["optimizer_s"] for m in h)
        return {
            "out": str(self.out), "base": self.base.name, "base_fingerprint": self.base_fingerprint, "tune": self.cfg.tune,
            "optimizer": self.cfg.optimizer, "steps": step, "total_steps": self.total_steps, "tokens": self.tokens_seen,
            "seq_len": self.seq_len, "rows_per_step": self.rows_per_step, "world": self.info.world,
            "final_loss": h[-1]["loss"] if h else None, "eval_loss_start": eval_start, "eval_loss": eval_end,
            "tokens_per_s": sum(self.rows_per_step * self.seq_len for _ in h) / steps_s if steps_s else None,
            "optimizer_share": opt_s / steps_s if steps_s else None,
            "muon_parameters": self.split.muon_numel, "adamw_parameters": self.split.adamw_numel,
            "data": self.data_report.summary(), "wall_s": wall, "completed": step >= self.total_steps,
        }


def train(cfg: TrainConfig, **kwargs: Any) -> dict[str, Any]:
    """Run one fine-tune (see `Trainer`); returns its summary."""
    return Trainer(cfg, **kwargs).run()


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed fp32 cross-entropy of logits [B, T, vocab] against labels [B, T] over the trained
    (non-ignored) positions."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
