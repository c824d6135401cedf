"""Rebuild the bundled demo model from scratch: run the plan (plan.py), stage by stage.

    nice -n 5 .venv/bin/python -m recipes.demo_model.build --seed 0 --out /tmp/laplace-default

(from the repository root). Steps, each under --work (default /tmp/laplace-default-build):
1. English text: the standard library's docstrings (corpus.py), split train / held out.
2. Tokenizer: byte-level BPE, 3,072 tokens with the chat special tokens (data.py).
3. A seeded, untrained model of plan.MODEL (`init/`).
4. Every stage of plan.PLAN in order: its data (a pure function of --seed and the
   stage's own seed), one training call (train.py), and the check it names (phase 1's
   go/no-go recall, phase 2's validation, phase 5's key checks), recorded, never acted on.
5. Evaluation (held-out recall, "not told", updates, two codes held, end of turn, held-out
   perplexity) and the model directory with its card in --out. `card.py` then folds the
   long records into training_log.json and adds a probe report.

`--stop-after-stage NAME` ends after that stage (its model is evaluated and written as
usual) and `--steps-scale F` scales every stage's steps (and data) by F: with `--tiny`
(the tiny preset's widths) they make a smoke run of the whole plan in minutes.
`--baseline` also trains the softmax transformer of the same widths on the first stage's
rows for its steps and compares held-out perplexity at equal tokens (baseline.py).
Trials that did not ship build on `Build` from recipes/experiments/ (phase6.py).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.config import PRESETS
from agent.runtime.model import build_model
from agent.runtime.tokenizer import ChatTemplate
from recipes.demo_model import data as rdata
from recipes.demo_model import keys
from recipes.demo_model.corpus import Passage, read_passages, split_passages, wide_text
from recipes.demo_model.plan import BATCH_TOKENS, CURRICULUM, DRILL, MODEL, PLAN, VOCAB, Chat, KeyDrills, Stage, scaled
from recipes.demo_model.recall_eval import end_of_turn, evaluate
from recipes.demo_model.train import held_out_perplexity, log, train_stage
from recipes.demo_model.worlds import world

GATE = 0.5  # phase 1's go/no-go: mean recall at distance <= 128
GATE_TRIALS, VAL_TRIALS = 24, 16
VAL_SEED = 5_551_212  # phase 2's validation world seed; the final evaluation uses recall_eval.EVAL_SEED


def validation_score(val: dict[str, Any]) -> float:
    """Phase 2's one number per cycle: the four recall floors, equally weighted."""
    r5, nt, st = val["recall_5digit"], val["not_told"], val["update_stale"]
    return (r5[256] + r5[512] + nt[256] + (1 - st[256])) / 4


class Build:
    """One run of the plan under `work`; `history` is what the card records."""

    def __init__(self, args: argparse.Namespace, plan: tuple[Stage, ...], passages: list[Passage] | None = None) -> None:
        self.args, self.plan, self.work = args, plan, Path(args.work)
        self.train_p, self.held_p = split_passages(read_passages() if passages is None else passages)
        self.history: list[dict[str, Any]] = []
        self._worlds: dict[str, Any] = {}
        self._wide: list[Passage] | None = None

    @staticmethod
    def dialogues(stage: Stage) -> int:
        """How many dialogues a `Chat` stage writes: ~1 epoch of its steps (10% spare)."""
        d = stage.data
        assert isinstance(d, Chat)
        share = (1 - d.text_share) if d.text_in_steps else 1
        return math.ceil(stage.n_steps * BATCH_TOKENS * share / d.spec.length * 1.1)

    def data(self, stage: Stage, folder: Path, lm: LoadedModel) -> dict[str, Any]:
        """Write `stage`'s data into `folder` (emptied first); returns what it holds."""
        if folder.exists():
            shutil.rmtree(folder)
        seed, d = self.args.seed + stage.seed, stage.data
        if isinstance(d, KeyDrills):
            return {"block": stage.name.split(".")[-1], **keys.write_block(folder, d, seed=seed, steps=stage.n_steps, lm=lm, train=self.train_p),
                    "keys": d.keys}
        n = self.dialogues(stage)
        if d.world not in self._worlds:
            self._worlds[d.world] = world(d.world, self.train_p)
        if d.text == "wide" and self._wide is None:
            self._wide = wide_text(self.train_p)
        return rdata.write_stage(folder, seed=seed, stage=d.stream, spec=d.spec, n_dialogues=n, passages=self.train_p,
                                 tok=lm.tokenizer, template=lm.template, world=self._worlds[d.world], text_share=d.text_share,
                                 text=self._wide if d.text == "wide" else None)

    def check(self, stage: Stage, run: Path, entry: dict[str, Any]) -> None:
        """Measure what `stage.check` names on the model in `run`, into `entry`."""
        if stage.check is None:
            return
        lm, trials = load_model_dir(run), self.args.eval_trials
        if stage.check == "gate":
            gate = evaluate(lm, self.held_p, distances=(0, 32, 64, 128), trials=min(GATE_TRIALS, trials), kinds=("recall",))
            mean = sum(gate["recall"].values()) / len(gate["recall"])
            entry["gate"] = {"recall": gate["recall"], "mean": mean, "go": mean >= GATE}
        elif stage.check == "validation":
            val = evaluate(lm, self.held_p, distances=(256, 512), trials=min(VAL_TRIALS, trials), seed=VAL_SEED,
                           kinds=("recall", "never", "update"))
            entry["validation"] = {"step": stage.steps[1], "score": validation_score(val), "recall_5digit": val["recall_5digit"],
                                   "not_told": val["not_told"], "update_stale": val["update_stale"],
                                   "refused_stated": val["refused_stated"]}
        else:
            entry["checks"] = [keys.check(lm, self.held_p, stage.n_steps, greedy=not stage.focus_only)]
        log(f"{stage.name} check: {({k: entry[k] for k in ('gate', 'validation', 'checks') if k in entry})}")

    def start(self) -> tuple[Path, tuple[Stage, ...]]:
        """The model the first stage trains from (a trained tokenizer and a seeded, untrained
        model of plan.MODEL, in `init/`) and the stages to run (the whole plan)."""
        args = self.args
        tok = rdata.train_tokenizer(self.train_p, args.seed, VOCAB)
        config = PRESETS["tiny"].replace(vocab_size=VOCAB) if args.tiny else MODEL
        init = LoadedModel(build_model(config, seed=args.seed), tok, ChatTemplate(), name="laplace-default-init",
                           card={"name": "laplace-default-init", "trained": False})
        save_model_dir(init, self.work / "init")
        return self.work / "init", self.plan

    def train(self, stage: Stage, **kw: Any) -> dict[str, Any]:
        """One stage's training call (`train.train_stage`); the trainer's summary."""
        return train_stage(stage, **kw)

    def run(self) -> Path:
        """Tokenizer, init, then every stage; returns the last stage's model directory."""
        args, work = self.args, self.work
        work.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(args.threads)
        log(f"corpus: {len(self.train_p)} train passages, {len(self.held_p)} held-out passages; {len(self.plan)} stages")
        rdata.write_text(work / "heldout" / "heldout_text.jsonl", self.held_p)
        model_dir, stages = self.start()
        base_dir = run = model_dir
        base = load_model_dir(base_dir)
        for stage in stages:
            if not stage.resume:  # a fresh run from the last stage's model
                base_dir, run = model_dir, work / "runs" / stage.name
                base = load_model_dir(base_dir)
                if run.exists():
                    shutil.rmtree(run)
            folder = work / "data" / stage.name
            info = self.data(stage, folder, base)
            log(f"{stage.name}: steps {stage.steps[0]}..{stage.steps[1]} of {stage.schedule.total}, rows of {stage.rows}, "
                f"lr {stage.schedule.lr:g}; {info}")
            summary = self.train(stage, data=folder, run=run, base_dir=base_dir, base=base, seed=args.seed)
            entry = {"phase": stage.phase, "name": stage.name, "block": stage.name.split(".")[-1], "data": info,
                     "steps": list(stage.steps), "rows": stage.rows, "lr": stage.schedule.lr, "answer_weight": stage.answer_weight,
                     "tokens_per_s": summary["tokens_per_s"], "final_loss": summary["final_loss"], "wall_s": summary["wall_s"]}
            if stage.phase == 1:
                entry["drill"] = isinstance(stage.data, Chat) and stage.data.spec == DRILL
            if stage.phase == 2 and stage.name.split(".")[1].startswith("c"):
                entry["cycle"] = int(stage.name.split(".")[1][1:])
            if stage.focus:
                entry.update(focus=list(stage.focus), focus_only=stage.focus_only)
            self.check(stage, run, entry)
            self.history.append(entry)
            if stage.name == "p1.rows256":  # the checkpoint the softmax baseline is compared with
                shutil.copytree(run, work / "gate_ckpt", dirs_exist_ok=True, ignore=shutil.ignore_patterns("trainer"))
            elif stage.phase > 1:
                shutil.rmtree(folder)  # rebuilt from the seed if ever needed
            (work / "history.json").write_text(json.dumps(self.history, indent=2), encoding="utf-8")
            model_dir = run
            if stage.name == args.stop_after_stage:
                break
        return model_dir

    def summary(self) -> dict[str, Any]:
        """The card's per-phase lines, from the history."""
        h = self.history
        out: dict[str, Any] = {}
        p2 = [e for e in h if e["phase"] == 2]
        if p2:
            vals = [e["validation"] for e in p2 if "validation" in e]
            best = max(vals, key=lambda v: v["score"], default=None)
            cycles = [e for e in p2 if "cycle" in e]
            polish = [e for e in p2 if e["block"] == "polish"]
            out["phase2"] = {"steps": cycles[-1]["steps"][1] if cycles else 0,
                             "polish_steps": polish[0]["steps"][1] if polish else 0,
                             "best_validation_step": best["step"] if best else None,
                             "best_validation_score": best["score"] if best else None}
        p3 = [e for e in h if e["phase"] == 3]
        if p3:
            out["phase3"] = {"steps": sum(e["steps"][1] - e["steps"][0] for e in p3)}
        p5 = [e for e in h if e["phase"] == 5]
        if p5:
            out["phase5"] = {"steps": sum(e["steps"][1] for e in p5), **{e["block"]: e["steps"][1] for e in p5}}
        return out

    def card(self, lm: LoadedModel, evaluation: dict[str, Any]) -> dict[str, Any]:
        """The card `finish` writes beside the weights (`card.py` folds it into lines later)."""
        args = self.args
        steps = sum(e["steps"][1] - e["steps"][0] for e in self.history)
        tps = [e["tokens_per_s"] for e in self.history if e.get("tokens_per_s")]
        return {
            "name": "demo", "demo": True, "trained": True, "family": "laplace", "parameters": lm.config.parameters(),
            "recipe": f"python -m recipes.demo_model.build --seed {args.seed}", "seed": args.seed,
            "training_tokens": steps * BATCH_TOKENS, "training_steps": steps, "batch_tokens": BATCH_TOKENS,
            "tokens_per_s": round(sum(tps) / len(tps)) if tps else None, "device": f"cpu ({args.threads} thread(s), fp32)",
            "optimizer": "Muon (block matrices) + AdamW (embeddings, head, norms, conv, decay gates)",
            "curriculum": [{"rows": r, "gaps": [g0, g1]} for r, g0, g1 in CURRICULUM],
            **self.summary(), "stages": self.history,
            "data": {
                "english": "docstrings of the Python standard library (PSF License 2.0), read with ast from the local interpreter"
                           "; phase 3 adds its pydoc topics (PSF-2.0) and the docstrings of the installed torch (BSD-3-Clause)",
                "dialogues": "synthetic, generated from templates in recipes/demo_model (facts, questions, updates, "
                             "never-stated controls, documents, key drills)",
            },
            "tokenizer": f"byte-level BPE, {lm.tokenizer.vocab_size} tokens, digits split, trained with tokenizers on the training data",
            "eval": evaluation,
        }

    def finish(self, model_dir: Path) -> Path:
        """Evaluate `model_dir` and write the model directory with its card to --out."""
        args = self.args
        lm = load_model_dir(model_dir)
        t0 = time.perf_counter()
        recall = evaluate(lm, self.held_p, trials=args.eval_trials)
        eot = end_of_turn(lm, self.held_p)
        ppl = held_out_perplexity(lambda x: lm.model(x)[0], lm.tokenizer, lm.template, self.held_p)
        log(f"eval ({time.perf_counter() - t0:.0f} s): recall {recall}; end of turn {eot['ended_within_200']}; held-out ppl {ppl:.2f}")
        evaluation = {"heldout_recall": recall, "end_of_turn": {k: v for k, v in eot.items() if k != "samples"},
                      "heldout_text_perplexity": round(ppl, 3)}
        out = Path(args.out)
        save_model_dir(lm, out, card=self.card(lm, evaluation))
        (self.work / "eval.json").write_text(json.dumps({"recall": recall, "end_of_turn": eot, "ppl": ppl}, indent=2), encoding="utf-8")
        log(f"wrote {out} ({(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")
        return out


def argument_parser(description: str | None = __doc__) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the model directory to write (agent/models/demo is the shipped one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/laplace-default-build")
    # One thread: on a shared 2-core machine two OpenMP threads stall each other (measured
    # 112 tok/s with 2 threads vs ~1,000 with 1 while other jobs ran).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-trials", type=int, default=24, help="trials per distance of the final evaluation (and at most of the checks)")
    ap.add_argument("--stop-after-stage", default=None, metavar="NAME", help="end after this stage of the plan (e.g. p1.polish, p3)")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="scale every stage's steps and data (smoke runs); 1: the plan")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset's widths instead of the demo model's (smoke runs)")
    ap.add_argument("--baseline", action="store_true", help="also train the softmax baseline (baseline.py)")
    return ap


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace, stages: tuple[Stage, ...]) -> None:
    """Refuse bad arguments in one line (argparse's exit 2) before any work."""
    names = [s.name for s in stages]
    if args.stop_after_stage is not None and args.stop_after_stage not in names:
        ap.error(f"--stop-after-stage: no stage {args.stop_after_stage!r} in the plan; stages: {names[0]} ... {names[-1]} "
                 f"(list them with: python -c 'from recipes.demo_model.plan import PLAN; print([s.name for s in PLAN])')")
    if not args.steps_scale > 0:
        ap.error(f"--steps-scale must be positive, got {args.steps_scale}")
    for name in ("threads", "eval_trials"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argument_parser()
    args = ap.parse_args(argv)
    check_args(ap, args, PLAN)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    build = Build(args, scaled(PLAN, args.steps_scale))
    build.finish(build.run())
    if args.baseline:
        from recipes.demo_model.baseline import run_baseline

        run_baseline(Path(args.work), seed=args.seed, threads=args.threads)


if __name__ == "__main__":
    main()
