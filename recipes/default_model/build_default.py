"""The recipe of the bundled default model: one seeded command that rebuilds it from scratch.

    nice -n 5 .venv/bin/python -m recipes.default_model.build_default --seed 0

Steps (each writes under --work, default /tmp/laplace-default-build):
1. English text: the standard library's docstrings (corpus.py), split train / held out.
2. Tokenizer: byte-level BPE, 3,072 tokens with the chat special tokens (data.py).
3. A seeded, untrained Laplace model of DEFAULT_CONFIG (`init/`).
4. Curriculum: the project's own Trainer (`laplace finetune`'s engine: Muon for block
   matrices, AdamW for the rest) runs one global WSD schedule over STAGES; each stage is a
   resume of the same run on longer dialogues with longer gaps. After the first stage a
   go/no-go check asks held-out questions at distance <= 128: below GATE the first stage
   is repeated (at most MAX_REPEATS times) before the dialogues lengthen.
5. A final dense drill at rows of 256 inside the LR decay (`--polish-steps`, default 150).
   Steps 3-5 are phase 1; `--from-model DIR` skips them and starts phase 2 from DIR.
6. Phase 2 (phase2.py): cycles of rows of 512 / 1,024, a dense drill and a sparse
   never-stated block with widened key words, validated after every cycle
   (`--phase2-steps`, `--phase2-minutes`), then a short polish (`--phase2-polish-steps`).
7. Phase 3 (phase3.py): never-stated questions asked at the same moments as stated ones,
   and four times more prose (`--phase3-steps`). `--from-model` with `--phase2-steps 0`
   runs phase 3 alone on a phase-2 output, whose training log is carried over.
8. Phase 4 (phase4.py), experimental and off unless `--phase4-steps` is given: recall by
   key, not by the latest value. Key drills and a plain-text lookup task
   (`--phase4-lookup-steps`), then those mixed with phase-3 rows (`--phase4-mix-steps`),
   then the same with lookup records closer to chat answers (`--phase4-steps`). The run
   made is equivalent to `--from-model agent/models/default --phase2-steps 0
   --phase3-steps 0 --phase4-steps 1000` (same data, byte for byte, and schedules); its
   model is not shipped: see docs/default-model.md.
9. Phase 5 (phase5.py), the shipped model's last phase (off if its blocks after decide
   all have 0 steps): answer by key, copy the key, refuse at the key. Key drills with the loss on the values'
   first digits only (`--phase5-bind-steps`), key drills with the loss on the decision
   tokens only (`--phase5-decide-steps`; keys of made-up words or, with
   `--phase5-decide-keys real`, phase 3's words), then those mixed with phase-3 rows and
   prose (`--phase5-steps`), then the same at rows of 1,024 with the user's own details in
   the drills and more updates (`--phase5-long-steps`); defaults 450 / 1,200 (real) / 700
   / 1,000, the run shipped. A last block with more never-stated and updated facts asked
   at a distance (`--phase5-far-steps`) is off: it traded recall for refusals. So is a
   block on heads widened to 64 x 64 (`--phase5-wide-steps`, widen.py): it did not help.
10. Evaluation (held-out recall, "not told", updates, two codes held, end of turn, held-out
   perplexity) and the model directory with its card in --out (default agent/models/default).
`--baseline` then trains the softmax transformer of the same widths on the same rows for
the gate checkpoint's steps and compares held-out perplexity at equal tokens.
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

from recipes.default_model import data as rdata
from recipes.default_model.corpus import Passage, read_passages, split_passages
from recipes.default_model.dialogues import DialogueSpec
from recipes.default_model.recall_eval import end_of_turn, evaluate
from agent.runtime.checkpoint import LoadedModel, ModelLoadError, load_model_dir, save_model_dir
from agent.runtime.config import LaplaceConfig
from agent.runtime.model import build_model
from agent.runtime.tokenizer import ChatTemplate, Tokenizer
from agent.train.config import TrainConfig
from recipes.default_model.weighted import WeightedTrainer

VOCAB = 3072
DEFAULT_CONFIG = LaplaceConfig(
    name="laplace-default", vocab_size=VOCAB, d_model=256, n_layers=4, n_heads=8, head_k_dim=32, head_v_dim=32,
    ffn_dim=640, chunk_size=128, half_life_max=2048.0,
)
BATCH_TOKENS = 4096
LR = 2e-3
# (length, gap_min, gap_max, steps): dense short drills first, then longer rows and gaps.
STAGES: list[tuple[int, int, int, int]] = [
    (256, 0, 160, 250),
    (512, 0, 400, 400),
    (1024, 32, 900, 400),
    (2048, 64, 1900, 250),
]
GATE = 0.5  # recall at distance <= 128 needed before the dialogues lengthen
MAX_REPEATS = 8
DRILL_STEPS = 150  # one dense-drill block after a no-go
ANSWER_WEIGHT = 4.0  # loss weight of recall answers (phase 1 after its second no-go; all of phase 2)
# The no-go drill: rows of 256, short gaps, many live facts, little unrelated text.
DRILL = dict(gap_min=0, gap_max=96, max_live=8, plant_prob=0.6, filler_words=20, small_talk=0.8, doc_prob=0.04, name_prob=0.02)


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def _max_live(length: int) -> int:
    return 4 + length // 128


def stage_data(work: Path, seed: int, stage: int, passages: list[Passage], tok: Tokenizer, template: ChatTemplate,
               steps: int, drill: bool = False) -> tuple[Path, dict]:
    length, gmin, gmax, _ = STAGES[stage]
    folder = work / (f"stage{stage}" if not drill else f"stage{stage}_drill{seed}")
    n = math.ceil(steps * BATCH_TOKENS / length * 1.1)  # ~1 epoch of dialogues (10% spare)
    if drill:
        spec = DialogueSpec(length=length, **DRILL)  # type: ignore[arg-type]
    elif stage == 0:
        spec = DialogueSpec(length=length, gap_min=gmin, gap_max=gmax, max_live=_max_live(length))
    else:
        spec = DialogueSpec(length=length, gap_min=gmin, gap_max=gmax, max_live=_max_live(length), name_prob=0.04)
    info = rdata.write_stage(folder, seed=seed, stage=stage, spec=spec, n_dialogues=n, passages=passages, tok=tok, template=template)
    return folder, info


def held_out_perplexity(forward: Any, tok: Tokenizer, template: ChatTemplate, passages: list[Passage], window: int = 256) -> float:
    """exp(mean NLL) over the held-out docstrings, in windows of `window` tokens from a
    fresh state (the same windows for every model)."""
    ids: list[int] = []
    for p in passages:
        ids += [tok.token_id(template.bos_token)] + tok.encode(p.text)
    total, count = 0.0, 0
    with torch.inference_mode():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[s : s + window + 1]])
            if chunk.shape[1] < 2:
                break
            logits = forward(chunk[:, :-1])
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
            count += chunk.shape[1] - 1
    return math.exp(total / count)


def train_main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    passages = read_passages()
    train_p, held_p = split_passages(passages)
    log(f"corpus: {len(train_p)} train passages, {len(held_p)} held-out passages")
    template = ChatTemplate()
    run = work / "run"
    progress = work / "progress.json"
    if args.resume and progress.exists():
        # Continue an interrupted recipe after its last finished block (same tokenizer and
        # init; the data of the next block is rebuilt from the seed as before).
        base = load_model_dir(work / "init")
        tok = base.tokenizer
        p = json.loads(progress.read_text(encoding="utf-8"))
        step, stage, repeats, total_steps, plan = p["step"], p["stage"], p["repeats"], p["total_steps"], p["plan"]
        history, shortened = p["history"], p["shortened"]
        log(f"resuming the recipe at step {step}, stage {stage}, repeat {repeats}")
    else:
        tok = rdata.train_tokenizer(train_p, args.seed, VOCAB)
        model = build_model(DEFAULT_CONFIG, seed=args.seed)
        init = LoadedModel(model, tok, template, name="laplace-default-init", card={"name": "laplace-default-init", "trained": False})
        save_model_dir(init, work / "init")
        base = load_model_dir(work / "init")
        if run.exists():
            shutil.rmtree(run)
        step, stage, repeats = 0, 0, 0
        plan = [s[3] for s in STAGES]
        total_steps = sum(plan)
        history, shortened = [], []
    rdata.write_text(work / "heldout" / "heldout_text.jsonl", held_p)
    t_start, step_at_start = time.perf_counter(), step
    while stage < len(STAGES):
        length = STAGES[stage][0]
        if args.budget_minutes and step > step_at_start:
            # Shrink the stages still to come (all by one factor, at least 20 steps each) so
            # the run ends inside the budget; WSD is flat before its decay, so a shorter
            # total only moves the decay earlier. Recorded in the card when it happens.
            per_step = (time.perf_counter() - t_start) / (step - step_at_start)
            allowed = int((args.budget_minutes * 60 - (time.perf_counter() - t_start)) / per_step)
            left = sum(plan[stage:])
            if allowed < left:
                factor = max(0.0, allowed / left)
                plan[stage:] = [max(20, int(p * factor)) for p in plan[stage:]]
                total_steps = step + sum(plan[stage:])
                log(f"budget: {per_step:.1f} s/step, remaining stages cut to {plan[stage:]} (total {total_steps} steps)")
                shortened.append({"at_step": step, "plan": list(plan)})
        drill = stage == 0 and repeats > 0
        folder, info = stage_data(work, args.seed + 101 * repeats, stage, train_p, tok, template,
                                  steps=DRILL_STEPS if drill else plan[stage], drill=drill)
        steps = DRILL_STEPS if drill else plan[stage]
        if stage == len(STAGES) - 1:
            steps = total_steps - step  # the last stage takes what is left of the total
        end = min(total_steps, step + steps)
        log(f"stage {stage}{' (dense drill)' if drill else ''} (rows of {length}): steps {step}..{end}; {info}")
        cfg = TrainConfig(data=(str(folder),), out=str(run), base=str(work / "init"), steps=total_steps, seq_len=length,
                          batch_tokens=BATCH_TOKENS, lr=LR, warmup=30, schedule="wsd", decay_fraction=0.2,
                          resume=str(run) if step else None, stop_after=end, seed=args.seed, device="cpu")
        # Escalation after a second no-go: weight the recall answers in the loss from then on.
        weight = ANSWER_WEIGHT if repeats >= 2 else 1.0
        summary = WeightedTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=weight).run()
        history.append({"stage": stage, "repeat": repeats, "drill": drill, "answer_weight": weight, "data": info, "steps": [step, end],
                        "tokens_per_s": summary["tokens_per_s"], "final_loss": summary["final_loss"], "wall_s": summary["wall_s"]})
        step = end
        advance_stage = True
        if stage == 0:
            lm = load_model_dir(run)
            gate = evaluate(lm, held_p, distances=(0, 32, 64, 128), trials=24, kinds=("recall",))
            short = sum(gate["recall"].values()) / len(gate["recall"])
            log(f"go/no-go at step {step}: recall at <=128 = {gate['recall']} (mean {short:.2f}, gate {GATE})")
            history[-1]["gate"] = {"recall": gate["recall"], "mean": short, "go": short >= GATE}
            if step == STAGES[0][3]:  # the checkpoint the softmax baseline is compared with
                shutil.copytree(run, work / "gate_ckpt", dirs_exist_ok=True, ignore=shutil.ignore_patterns("trainer"))
            if short < GATE and repeats < MAX_REPEATS and _time_for_drill(args, t_start, step - step_at_start):
                # No-go: short-range recall is not there yet, so do not lengthen. Switch to
                # the dense drill (more facts and questions, short unrelated chat) and add
                # its steps to the total.
                repeats += 1
                total_steps += DRILL_STEPS
                advance_stage = False
        if advance_stage:
            stage += 1
        progress.write_text(json.dumps({"step": step, "stage": stage, "repeats": repeats, "total_steps": total_steps, "plan": plan,
                                        "history": history, "shortened": shortened}, indent=2), encoding="utf-8")
    (work / "history.json").write_text(json.dumps(history, indent=2), encoding="utf-8")
    return {"history": history, "steps": step, "tokens": step * BATCH_TOKENS, "shortened": shortened}


def polish(args: argparse.Namespace, trained: dict[str, Any]) -> dict[str, Any]:
    """A last dense drill at rows of 256, inside the schedule's decay. Without it the run
    ended on long rows whose far questions it could not yet answer, and it learned to say
    "You haven't told me" to everything (measured: refusals even right after the fact)."""
    work, run = Path(args.work), Path(args.work) / "run"
    torch.set_num_threads(args.threads)
    base = load_model_dir(work / "init")
    train_p, _ = split_passages(read_passages())
    step = trained["steps"]
    end = step + args.polish_steps
    folder, info = stage_data(work, args.seed + 9999, 0, train_p, base.tokenizer, base.template, steps=args.polish_steps, drill=True)
    log(f"polish: dense drill (rows of 256), steps {step}..{end}; {info}")
    cfg = TrainConfig(data=(str(folder),), out=str(run), base=str(work / "init"), steps=end, seq_len=256,
                      batch_tokens=BATCH_TOKENS, lr=LR, warmup=30, schedule="wsd", decay_fraction=0.2,
                      resume=str(run), stop_after=end, seed=args.seed, device="cpu")
    summary = WeightedTrainer(cfg, base=base, on_log=log, on_step=log_progress, answer_weight=ANSWER_WEIGHT).run()
    trained["history"].append({"stage": "polish", "repeat": 0, "drill": True, "answer_weight": ANSWER_WEIGHT, "data": info,
                               "steps": [step, end], "tokens_per_s": summary["tokens_per_s"], "final_loss": summary["final_loss"],
                               "wall_s": summary["wall_s"]})
    (work / "history.json").write_text(json.dumps(trained["history"], indent=2), encoding="utf-8")
    return {**trained, "steps": end, "tokens": end * BATCH_TOKENS}


def _time_for_drill(args: argparse.Namespace, t_start: float, steps_done: int) -> bool:
    """Another drill block fits the budget with ~200 steps left for the longer stages."""
    if not args.budget_minutes or steps_done <= 0:
        return True
    per_step = (time.perf_counter() - t_start) / steps_done
    left = args.budget_minutes * 60 - (time.perf_counter() - t_start)
    return left > (DRILL_STEPS + 200) * per_step


def log_progress(m: dict[str, Any]) -> None:
    if m["step"] % 10 == 0 or m["step"] == 1:
        log(f"step {m['step']}/{m['total_steps']} loss {m['loss']:.3f} lr {m['lr']:.2e} {m['tokens_per_s']:.0f} tok/s")


def finish(args: argparse.Namespace, trained: dict[str, Any], model_dir: Path) -> None:
    """Evaluate `model_dir` and write the shipped model directory with its card."""
    work = Path(args.work)
    torch.set_num_threads(args.threads)
    _, held_p = split_passages(read_passages())
    lm = load_model_dir(model_dir)
    t0 = time.perf_counter()
    recall = evaluate(lm, held_p, trials=args.eval_trials)
    eot = end_of_turn(lm, held_p)
    ppl = held_out_perplexity(lambda x: lm.model(x)[0], lm.tokenizer, lm.template, held_p)
    log(f"eval ({time.perf_counter() - t0:.0f} s): recall {recall}; end of turn {eot['ended_within_200']}; held-out ppl {ppl:.2f}")
    hist = trained["history"]
    tps = [h["tokens_per_s"] for h in hist if h.get("tokens_per_s")]
    card = {
        "name": "default", "trained": True, "family": "laplace", "parameters": lm.config.parameters(),
        "recipe": f"python -m recipes.default_model.build_default --seed {args.seed}", "seed": args.seed,
        "training_tokens": trained["tokens"], "training_steps": trained["steps"], "batch_tokens": BATCH_TOKENS,
        "tokens_per_s": round(sum(tps) / len(tps)) if tps else None, "device": "cpu (2 cores, fp32)",
        "optimizer": "Muon (block matrices) + AdamW (embeddings, head, norms, conv, decay gates)",
        "curriculum": [{"rows": s[0], "gaps": [s[1], s[2]]} for s in STAGES],
        "phase2": trained.get("phase2"), "phase3": trained.get("phase3"), "phase4": trained.get("phase4"),
        "phase5": trained.get("phase5"),
        "stages": hist, "schedule_shortened": trained.get("shortened") or None,
        "data": {
            "english": "docstrings of the Python standard library (PSF License 2.0), read with ast from the local interpreter"
                       + ("; phase 3 adds its pydoc topics (PSF-2.0) and the docstrings of the installed torch (BSD-3-Clause)"
                          if trained.get("phase3") else ""),
            "dialogues": "synthetic, generated from templates in recipes/default_model (facts, questions, updates, never-stated controls, documents)"
                         + ("; phase 4 adds key drills and a plain-text lookup task (recipes/default_model/lookup.py)" if trained.get("phase4") else ""),
        },
        "tokenizer": f"byte-level BPE, {lm.tokenizer.vocab_size} tokens, digits split, trained with tokenizers on the training data",
        "eval": {"heldout_recall": recall, "end_of_turn": {k: v for k, v in eot.items() if k != "samples"},
                 "heldout_text_perplexity": round(ppl, 3)},
    }
    out = Path(args.out)
    save_model_dir(lm, out, card=card)
    (work / "eval.json").write_text(json.dumps({"recall": recall, "end_of_turn": eot, "ppl": ppl}, indent=2), encoding="utf-8")
    log(f"wrote {out} ({(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "agent" / "models" / "default"))
    ap.add_argument("--work", default="/tmp/laplace-default-build")
    # One thread: on a shared 2-core machine two OpenMP threads stall each other (measured
    # 112 tok/s with 2 threads vs ~1,000 with 1 while other jobs ran).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-trials", type=int, default=24)
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="shrink the later stages if the run would take longer (not reproducible then; the card says so)")
    ap.add_argument("--polish-steps", type=int, default=150, help="final dense drill at rows of 256 (0: none)")
    ap.add_argument("--resume", action="store_true", help="continue an interrupted recipe in --work after its last finished block")
    ap.add_argument("--baseline", action="store_true", help="also train the softmax baseline (see baseline.py)")
    ap.add_argument("--from-model", default=None,
                    help="skip phase 1 and start phase 2 from this model directory (a phase-1 output)")
    ap.add_argument("--phase2-steps", type=int, default=2400, help="phase 2 (long-range recall) steps; 0: none")
    ap.add_argument("--phase2-minutes", type=float, default=None, help="cut phase 2 to end within this many minutes")
    ap.add_argument("--phase2-polish-steps", type=int, default=500, help="last drill with more text after phase 2; 0: none")
    ap.add_argument("--phase3-steps", type=int, default=1500, help="phase 3 (ghost questions, wide prose) steps; 0: none")
    ap.add_argument("--phase4-lookup-steps", type=int, default=900,
                    help="phase 4's first block (key drill + lookup task, rows of 256) steps; 0: none")
    ap.add_argument("--phase4-mix-steps", type=int, default=500,
                    help="phase 4's second block (phase-3 rows + key drill + lookup task, rows of 512) steps; 0: none")
    ap.add_argument("--phase4-steps", type=int, default=0,
                    help="phase 4's last block (as the second, with lookup records closer to chat) steps; 0 (default): no "
                         "phase 4, which is experimental and not part of the shipped model (the run made: 1000)")
    ap.add_argument("--phase5-bind-steps", type=int, default=450,
                    help="phase 5's first block (key drills, loss on the values' first digits only) steps; 0: none")
    ap.add_argument("--phase5-decide-steps", type=int, default=1200,
                    help="phase 5's second block (key drills, loss on the decision tokens only) steps; 0: none")
    ap.add_argument("--phase5-decide-keys", choices=("fragment", "real"), default="real",
                    help="the decide block's key words: made-up words of the tokenizer's pieces, or phase 3's words")
    ap.add_argument("--phase5-steps", type=int, default=700,
                    help="phase 5's mix block (phase-3 rows + key drills + prose) steps; 0: none")
    ap.add_argument("--phase5-long-steps", type=int, default=1000,
                    help="phase 5's long block (as the mix, rows of 1,024, details drilled beside codes, more updates) "
                         "steps; 0: none")
    ap.add_argument("--phase5-details-steps", type=int, default=0,
                    help="phase 5's block after the long one (its data, plus details named with made-up words) steps; "
                         "0 (default): none")
    ap.add_argument("--phase5-gaps-steps", type=int, default=0,
                    help="phase 5's block after the long one (its data, with unrelated chat between a drill's statements "
                         "and questions) steps; 0 (default): none")
    ap.add_argument("--phase5-far-steps", type=int, default=0,
                    help="phase 5's last block (as the long one, more never-stated and updated facts asked at a distance, "
                         "details of made-up words) steps; 0 (default): none, it traded recall for refusals")
    ap.add_argument("--phase5-wide-steps", type=int, default=0,
                    help="phase 5's last block: the heads widened from 32 x 32 to 64 x 64 (same outputs), then trained on "
                         "fresh data of the long block, steps; 0 (default): none, it did not help (the run made: 1200). "
                         "Phase 5 runs unless this and the steps of the mix, long, details, gaps and far blocks are all 0")
    args = ap.parse_args()
    for name in ("phase2_steps", "phase2_polish_steps", "phase3_steps", "phase4_lookup_steps", "phase4_mix_steps",
                 "phase4_steps", "phase5_bind_steps", "phase5_decide_steps", "phase5_steps", "phase5_long_steps",
                 "phase5_details_steps", "phase5_gaps_steps", "phase5_far_steps", "phase5_wide_steps"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0 (0 skips it)")
    if args.phase2_minutes is not None and args.phase2_minutes <= 0:
        ap.error("--phase2-minutes must be positive")
    if args.from_model:
        start = Path(args.from_model)
        try:
            card = load_model_dir(start).card
        except ModelLoadError as exc:
            ap.error(f"--from-model: {exc}")
        log_path = start / "training_log.json"  # the given model's stages, written by card.py
        given_log = json.loads(log_path.read_text(encoding="utf-8")) if log_path.exists() else None
        trained: dict[str, Any] = {"history": [{"phase": 1, "from_model": str(start), "card": card, "log": given_log}],
                                   "steps": card.get("training_steps", 0), "tokens": card.get("training_tokens", 0)}
        if given_log and any(h.get("phase") == 2 for h in given_log.get("stages", [])):
            # A phase-2 (or later) output: its own history (phase 1 as it was given, then the
            # later phases) goes on.
            trained.update(history=given_log["stages"], phase2=card.get("phase2"), phase3=card.get("phase3"),
                           phase4=card.get("phase4"), phase5=card.get("phase5"))
    else:
        trained = train_main(args)
        if args.polish_steps:
            trained = polish(args, trained)
        start = Path(args.work) / "run"
    model_dir = start
    if args.phase2_steps:
        from recipes.default_model.phase2 import extend, polish as polish2  # phase2 builds on this module's constants

        p2 = extend(args, start)
        steps = p2["steps"]
        history = trained["history"] + p2["history"]
        model_dir = Path(args.work) / "phase2"
        if args.phase2_polish_steps:
            history.append(polish2(args, model_dir))
            steps += args.phase2_polish_steps
            model_dir = Path(args.work) / "phase2_polish"
        trained = {**trained, "history": history, "steps": trained["steps"] + steps, "tokens": trained["tokens"] + steps * BATCH_TOKENS,
                   "phase2": {"steps": p2["steps"], "polish_steps": args.phase2_polish_steps,
                              "best_validation_step": p2["best_step"], "best_validation_score": p2["best_score"]}}
    if args.phase3_steps:
        from recipes.default_model.phase3 import calibrate

        entry = calibrate(args, model_dir)
        model_dir = Path(args.work) / "phase3"
        trained = {**trained, "history": trained["history"] + [entry], "steps": trained["steps"] + args.phase3_steps,
                   "tokens": trained["tokens"] + args.phase3_steps * BATCH_TOKENS, "phase3": {"steps": args.phase3_steps}}
    if args.phase4_steps:
        from recipes.default_model.phase4 import match_keys

        entries = match_keys(args, model_dir)
        model_dir = Path(args.work) / "phase4_bridge"
        n = sum(e["steps"][1] for e in entries)
        trained = {**trained, "history": trained["history"] + entries, "steps": trained["steps"] + n,
                   "tokens": trained["tokens"] + n * BATCH_TOKENS,
                   "phase4": {"steps": n, **{e["block"]: e["steps"][1] for e in entries}}}
    if any((args.phase5_steps, args.phase5_long_steps, args.phase5_details_steps, args.phase5_gaps_steps, args.phase5_far_steps,
            args.phase5_wide_steps)):
        from recipes.default_model.phase5 import copy_keys

        entries, model_dir = copy_keys(args, model_dir)
        n = sum(e["steps"][1] for e in entries)
        trained = {**trained, "history": trained["history"] + entries, "steps": trained["steps"] + n,
                   "tokens": trained["tokens"] + n * BATCH_TOKENS,
                   "phase5": {"steps": n, **{e["block"]: e["steps"][1] for e in entries}}}
    finish(args, trained, model_dir)
    if args.baseline:
        from recipes.default_model.baseline import run_baseline

        run_baseline(Path(args.work), seed=args.seed, threads=args.threads)


if __name__ == "__main__":
    main()
