"""Phase 6, tried after the plan and not shipped: everyday details in plain speech.

    python -m recipes.experiments.phase6 --from-model agent/models/demo --first-stage p6.natural512 \\
        --out /tmp/laplace-phase6
    python -m recipes.experiments.phase6 card --model /tmp/laplace-phase6 --work /tmp/laplace-phase6-build

Everyday details said in passing, everyday questions with fluent replies (natural.py), then
made-up values (so values are copied, not picked from a pool) and the recall block; each
block beside phase-5 rows (`rest`) so the older skills keep being trained. The run builds on
the plan's `Build` (recipes/demo_model/build.py): the plan's stages, then these, or with
`--from-model DIR --first-stage NAME` from a model already trained through the stages
before NAME (the shipped model and p6.natural512). What it measured, and why it did not
ship: docs/recipe-experiments.md, Phase 6. `card` folds the run's records into its card as
the plan's card.py does, adding the phase-6 line and keeping the record the model came with.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.probes.natural_text import CONCEPTS
from agent.runtime.checkpoint import LoadedModel, load_model_dir
from recipes.demo_model import data as rdata
from recipes.demo_model import keys
from recipes.demo_model.build import Build, argument_parser, check_args
from recipes.demo_model.card import update_card
from recipes.demo_model.plan import BATCH_TOKENS, KEY_DRILL, MIX, PLAN, ROWS3, KeyDrills, Schedule, Stage, scaled
from recipes.demo_model.vocab import TRAIN
from recipes.demo_model.weighted import ANSWER_FORMS
from recipes.experiments.natural import NaturalBuilder, NaturalSpec

NATURAL512 = NaturalSpec(length=512, gap_min=0, gap_max=450)
WIDE512 = NaturalSpec(length=512, gap_min=0, gap_max=450, made_up=0.6, recall_block=0.5)
P6_STEPS = (1800, 1200)
# Answers about everyday details ("You parked on level 4.") count as recall answers too;
# none of them is a reply the plan's data holds.
ANSWERS = re.compile(rf"^({'|'.join((*ANSWER_FORMS, *(re.escape(c.answer).replace(re.escape('{v}'), '.+') for c in CONCEPTS)))})$")


@dataclass(frozen=True)
class Natural:
    """Phase 6's rows: plain-speech dialogues (`natural.NaturalBuilder`, `spec`) for
    `share` of the stage's tokens, and the rest a phase-5 block (`rest`)."""

    spec: NaturalSpec
    share: float
    rest: KeyDrills


def _phase6() -> list[Stage]:
    def sched(total: int) -> Schedule:
        return Schedule(lr=1e-3, warmup=20, total=total, decay=0.3)

    rest = KeyDrills(KEY_DRILL, shares=MIX, rows3=ROWS3)
    return [
        Stage("p6.natural512", 6, Natural(NATURAL512, 0.6, rest), 6161, (0, P6_STEPS[0]), sched(P6_STEPS[0])),  # type: ignore[arg-type]
        Stage("p6.wide512", 6, Natural(WIDE512, 0.7, rest), 6262, (0, P6_STEPS[1]), sched(P6_STEPS[1])),  # type: ignore[arg-type]
    ]


PHASE6: tuple[Stage, ...] = tuple(_phase6())
TRIAL: tuple[Stage, ...] = (*PLAN, *PHASE6)


class Phase6Build(Build):
    """The plan's build with phase 6's data, its answers weighted, and a start from a model."""

    def data(self, stage: Stage, folder: Path, lm: LoadedModel) -> dict[str, Any]:
        d = stage.data
        if not isinstance(d, Natural):
            return super().data(stage, folder, lm)
        if folder.exists():
            shutil.rmtree(folder)
        seed = self.args.seed + stage.seed
        info = keys.write_block(folder, d.rest, seed=seed, steps=max(1, round(stage.n_steps * (1 - d.share))), lm=lm, train=self.train_p)
        builder = NaturalBuilder(rdata.make_builder(TRAIN, self.train_p, lm.tokenizer, lm.template))
        n = math.ceil(stage.n_steps * BATCH_TOKENS * d.share / d.spec.length * 1.05)
        info["natural_tokens"] = rdata.write_dialogues(folder / "a_natural.jsonl", builder, random.Random(seed * 1000 + 6), d.spec, n,
                                                       lm.tokenizer, lm.template)
        return {"block": stage.name.split(".")[-1], **info, **builder.stats}

    def train(self, stage: Stage, **kw: Any) -> dict[str, Any]:
        return super().train(stage, answers=ANSWERS, **kw)

    def start(self) -> tuple[Path, tuple[Stage, ...]]:
        if not self.args.from_model:
            return super().start()
        names = [s.name for s in self.plan]
        return Path(self.args.from_model), self.plan[names.index(self.args.first_stage):]

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        p6 = [e for e in self.history if e["phase"] == 6]
        if p6:
            out["phase6"] = {"steps": sum(e["steps"][1] for e in p6), **{e["block"]: e["steps"][1] for e in p6}}
        return out

    def card(self, lm: LoadedModel, evaluation: dict[str, Any]) -> dict[str, Any]:
        card = super().card(lm, evaluation)
        if not self.args.from_model:
            return card
        # The earlier stages' record stays; this run's stages are added to it.
        before = load_model_dir(self.args.from_model).card
        steps = sum(e["steps"][1] - e["steps"][0] for e in self.history)
        return {**before, **self.summary(), "stages": self.history, "eval": evaluation,
                "recipe": f"{card['recipe']} (phases 1-5), then python -m recipes.experiments.phase6 --from-model DIR "
                          f"--first-stage {self.args.first_stage}",
                "training_steps": before.get("training_steps", 0) + steps,
                "training_tokens": before.get("training_tokens", 0) + steps * BATCH_TOKENS,
                "data": {"phases 1-5": before.get("data"),
                         "phase6": "plain-speech dialogues (recipes/experiments/natural.py) with paraphrases and everyday "
                                   "replies written by SmolLM2-135M-Instruct (Apache-2.0), cached in natural_cache.json"}}

    def finish(self, model_dir: Path) -> Path:
        out = super().finish(model_dir)
        record = Path(self.args.from_model or "") / "training_log.json"
        if self.args.from_model and record.exists():  # `card` adds this run's stages to it
            shutil.copy(record, out / "earlier_training_log.json")
        return out


def phase6_line(stages: list[dict[str, Any]]) -> str | None:
    """The card's one line for phase 6's blocks, from the run's stage records."""
    p6 = [h for h in stages if h.get("phase") == 6]
    return "; ".join(
        f"{h['steps'][1]} steps of rows of {h['rows']}: {h['data']['natural_tokens'] / 1e6:.2f} M tokens of plain-speech dialogues "
        f"({h['data'].get('facts', 0)} details, {h['data'].get('questions', 0)} questions, {h['data'].get('never', 0)} never stated, "
        f"{h['data'].get('updates', 0)} updates) beside phase-5 rows, lr {h['lr']:g} (WSD)" for h in p6) or None


def update_phase6_card(model_dir: Path, work: Path, probe_json: Path | None) -> dict[str, Any]:
    """`card.update_card` for a phase-6 run: the record the model came with first (copied in
    by `finish`), then this run's stages, and the phase-6 line."""
    earlier = model_dir / "earlier_training_log.json"
    record = json.loads(earlier.read_text(encoding="utf-8")) if earlier.exists() else None
    card = update_card(model_dir, work, probe_json, record=record)
    line = phase6_line(json.loads((model_dir / "training_log.json").read_text(encoding="utf-8"))["stages"])
    if line is not None:
        cfg_path = model_dir / "config.json"
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
        meta["card"] = card = {**card, "curriculum_phase6": line}
        cfg_path.write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    if earlier.exists():
        earlier.unlink()  # folded into training_log.json
    return card


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argument_parser(__doc__)
    ap.add_argument("--from-model", default=None, metavar="DIR",
                    help="start from this model (trained through the stages before --first-stage) instead of a new one")
    ap.add_argument("--first-stage", default=None, metavar="NAME", help="with --from-model: the first stage to run (e.g. p6.natural512)")
    args = ap.parse_args(argv)
    check_args(ap, args, TRIAL)
    names = [s.name for s in TRIAL]
    if args.first_stage is not None and args.first_stage not in names:
        ap.error(f"--first-stage: no stage {args.first_stage!r} in the plan; stages: {names[0]} ... {names[-1]}")
    if (args.from_model is None) != (args.first_stage is None):
        ap.error("--from-model and --first-stage go together: the model must be trained through the stages before the first one")
    if args.first_stage is not None and TRIAL[names.index(args.first_stage)].resume:
        ap.error(f"--first-stage {args.first_stage} continues the run before it; start at the first stage of a run instead")
    return args


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["card"]:
        ap = argparse.ArgumentParser(prog="phase6 card")
        ap.add_argument("--model", required=True)
        ap.add_argument("--work", default="/tmp/laplace-default-build")
        ap.add_argument("--probe", default=None)
        a = ap.parse_args(argv[1:])
        print(json.dumps(update_phase6_card(Path(a.model), Path(a.work), Path(a.probe) if a.probe else None), indent=2, default=str)[:4000])
        return
    args = parse_args(argv)
    build = Phase6Build(args, scaled(TRIAL, args.steps_scale))
    build.finish(build.run())


if __name__ == "__main__":
    main()
