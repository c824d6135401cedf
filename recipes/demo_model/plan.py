"""The plan of the bundled demo model: every training stage that shipped, in order.

One frozen `Stage` per block of training, as the shipped run made it (agent/models/demo's
card and training_log.json record it): its data, its steps on its schedule, its learning
rate, its data seed, its row length and its loss. `build.py` runs this list from scratch;
nothing in it decides anything at run time. Where the shipped run decided as it went, the
plan holds what it decided:

- Phase 1's go/no-go check (held-out recall at <= 128 tokens below 0.5 after the first
  stage) failed seven times; the run then repeated a dense drill six times before its
  longer rows, and weighted recall answers x4 from its second no-go on.
- Phase 1 ran under a time budget that shortened the stages still to come four times;
  each stage here lies on the WSD schedule length that was in force while it trained
  (`Schedule.total`), and its longer rows have the shortened step counts.
- Phase 2 ran 14 cycles of four blocks and was cut by its time budget after 3,320 steps
  (the last cycle after its third block). The plan gives its one schedule those 3,320
  steps from the start; that is the same learning rate at every step if the cut came
  before the decay began (step 2,656), which the log does not say.
- Phase 5's blocks were trained in stops of 250 steps (each a resume of the same run);
  here each runs straight through.

Experiments that did not ship (phase 4, phase 5's "details", "gaps", "far" and "wide"
blocks, phase 6's plain speech) are not here: docs/recipe-experiments.md records them and
what they measured, and recipes/experiments/ holds the code of those still runnable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agent.runtime.config import LaplaceConfig
from recipes.demo_model.dialogues import DialogueSpec

VOCAB = 3072
MODEL = LaplaceConfig(
    name="laplace-default", vocab_size=VOCAB, d_model=256, n_layers=4, n_heads=8, head_k_dim=32, head_v_dim=32,
    ffn_dim=640, chunk_size=128, half_life_max=2048.0,
)
BATCH_TOKENS = 4096
ANSWER_WEIGHT = 4.0  # loss weight of recall answers (weighted.py)
FOCUS_WEIGHT = 8.0  # loss weight of phase 5's decision tokens (weighted.FocusTrainer)
DECISION = ("digit", "decision", "key")


@dataclass(frozen=True)
class Chat:
    """Dialogue rows of `spec` plus plain prose (`data.write_stage`). Its random stream is
    `Random(seed * 1000 + stream)`; `world` names the keys and phrasings ("train",
    "phase2", "phase3": worlds.py); `text` the prose pool ("train" docstrings or "wide",
    corpus.wide_text). With `text_in_steps` the prose counts against the stage's tokens
    (fewer dialogues); otherwise it comes on top."""

    spec: DialogueSpec
    stream: int
    world: str = "train"
    text_share: float = 0.15
    text: str = "train"
    text_in_steps: bool = False


@dataclass(frozen=True)
class KeyDrills:
    """Phase 5's rows (`keys.write_block`): shares of phase-3 rows (`rows3`), key drills
    (`drill`) and wide prose; the drills' keys are "fragment" (made-up words), "real"
    (phase 3's words) or "phase2" (phase 2's world, plain phrasings)."""

    drill: DialogueSpec
    keys: str = "fragment"
    shares: tuple[float, float, float] = (0.0, 1.0, 0.0)
    rows3: DialogueSpec | None = None


@dataclass(frozen=True)
class Schedule:
    """Warmup then WSD: flat at `lr`, then a linear decay over the last `decay` share of
    `total` steps."""

    lr: float
    warmup: int
    total: int
    decay: float


@dataclass(frozen=True)
class Stage:
    """One block of training. `steps` is [start, end) on its schedule. With `resume` it
    continues the previous stage's run (same optimizer, same schedule start); otherwise it
    starts a fresh run from the previous stage's model. `seed` is added to the build's
    seed for its data. `check` is measured after it: "gate" (phase 1's go/no-go),
    "validation" (phase 2's), "keys" (phase 5's forced check, with `greedy` answers too)."""

    name: str
    phase: int
    data: Chat | KeyDrills  # (recipes/experiments/phase6.py adds its own kind, with a `spec`)
    seed: int
    steps: tuple[int, int]
    schedule: Schedule
    resume: bool = False
    answer_weight: float = ANSWER_WEIGHT
    focus: tuple[str, ...] = ()
    focus_only: bool = False
    check: str | None = None

    @property
    def rows(self) -> int:
        return self.data.drill.length if isinstance(self.data, KeyDrills) else self.data.spec.length

    @property
    def n_steps(self) -> int:
        return self.steps[1] - self.steps[0]


# Phase 1: the curriculum's rows (length, gap_min, gap_max) and its dense drill.
CURRICULUM = ((256, 0, 160), (512, 0, 400), (1024, 32, 900), (2048, 64, 1900))
DRILL = DialogueSpec(length=256, gap_min=0, gap_max=96, max_live=8, plant_prob=0.6, filler_words=20, small_talk=0.8, doc_prob=0.04,
                     name_prob=0.02)


def _rows(i: int) -> DialogueSpec:
    length, gmin, gmax = CURRICULUM[i]
    extra = {"name_prob": 0.04} if i else {}
    return DialogueSpec(length=length, gap_min=gmin, gap_max=gmax, max_live=4 + length // 128, **extra)  # type: ignore[arg-type]


def _phase1() -> list[Stage]:
    def sched(total: int) -> Schedule:
        return Schedule(lr=2e-3, warmup=30, total=total, decay=0.2)

    out = [Stage("p1.rows256", 1, Chat(_rows(0), 0), 0, (0, 250), sched(1300), answer_weight=1.0, check="gate")]
    # (repeat, schedule total in force): the no-go drills; from the second on, answers x4.
    for rep, total in ((1, 1450), (2, 1600), (3, 1382), (4, 1532), (5, 1344), (6, 1360)):
        start = 250 + 150 * (rep - 1)
        out.append(Stage(f"p1.drill{rep}", 1, Chat(DRILL, 0), 101 * rep, (start, start + 150), sched(total), resume=True,
                         answer_weight=1.0 if rep < 2 else ANSWER_WEIGHT, check="gate"))
    start = 1150
    for i, steps in ((1, 104), (2, 104), (3, 64)):  # the longer rows, shortened by the budget
        out.append(Stage(f"p1.rows{CURRICULUM[i][0]}", 1, Chat(_rows(i), i), 606, (start, start + steps), sched(1422), resume=True))
        start += steps
    out.append(Stage("p1.polish", 1, Chat(DRILL, 0), 9999, (1422, 1572), sched(1572), resume=True))
    return out


# Phase 2: long-range recall, "not told" and updates (cycles of four blocks), then a polish.
P2_COMMON = dict(never_prob=0.15, near_miss=0.5, update_prob=0.2, name_prob=0.04, vary_live=True)
P2_BLOCKS: tuple[tuple[str, DialogueSpec, int], ...] = (
    ("rows512", DialogueSpec(**{**P2_COMMON, "length": 512, "gap_min": 0, "gap_max": 450, "max_live": 8}), 80),  # type: ignore[arg-type]
    ("rows1024", DialogueSpec(**{**P2_COMMON, "length": 1024, "gap_min": 32, "gap_max": 900, "max_live": 12}), 80),  # type: ignore[arg-type]
    ("drill256", DialogueSpec(**{**P2_COMMON, "length": 256, "gap_min": 0, "gap_max": 96, "max_live": 8, "plant_prob": 0.6,  # type: ignore[arg-type]
                                 "filler_words": 20, "small_talk": 0.8, "doc_prob": 0.04}), 40),
    # One or two facts and many questions about things never said.
    ("sparse256", DialogueSpec(**{**P2_COMMON, "length": 256, "gap_min": 0, "gap_max": 200, "max_live": 2,  # type: ignore[arg-type]
                                  "plant_prob": 0.35, "never_prob": 0.3, "near_miss": 0.3}), 40),
)
P2_STEPS = 3320


def _phase2() -> list[Stage]:
    sched = Schedule(lr=1e-3, warmup=20, total=P2_STEPS, decay=0.2)
    out: list[Stage] = []
    step, cycle = 0, 0
    while step < P2_STEPS:
        for b, (name, spec, steps) in enumerate(P2_BLOCKS):
            if step >= P2_STEPS:
                break
            end = min(P2_STEPS, step + steps)
            last = end == P2_STEPS or b == len(P2_BLOCKS) - 1
            out.append(Stage(f"p2.c{cycle}.{name}", 2, Chat(spec, 100 + b, world="phase2"), 7919 * (cycle + 1), (step, end), sched,
                             resume=bool(out), check="validation" if last else None))
            step = end
        cycle += 1
    polish = Chat(P2_BLOCKS[2][1], 200, world="phase2", text_share=0.4, text_in_steps=True)
    out.append(Stage("p2.polish", 2, polish, 31337, (0, 500), Schedule(lr=3e-4, warmup=10, total=500, decay=1.0)))
    return out


# Phase 3: never-stated questions asked at the same moments as stated ones, and wide prose.
PHASE3 = DialogueSpec(**{**P2_COMMON, "length": 512, "gap_min": 0, "gap_max": 450, "max_live": 6, "never_prob": 0.03,  # type: ignore[arg-type]
                         "ghost_prob": 0.7, "near_miss": 0.3, "near_gap": 0.3})
P3_STAGE = Stage("p3", 3, Chat(PHASE3, 300, world="phase3", text_share=0.3, text="wide", text_in_steps=True), 4099, (0, 1500),
                 Schedule(lr=4e-4, warmup=20, total=1500, decay=0.5))

# Phase 5: answer by key, copy the key, refuse at the key.
BIND = DialogueSpec(length=256, gap_min=0, gap_max=0, key_drill=True)
KEY_DRILL = DialogueSpec(length=512, gap_min=0, gap_max=0, key_drill=True, key_local=True, drill_ghosts=(1, 3), far_ghosts=1.0,
                         drill_updates=0.3)
ROWS3 = dataclasses.replace(PHASE3, key_local=True, ghost_prob=0.3, near_gap=0.0)
MIX = (0.4, 0.4, 0.2)  # phase-3 rows, key drills, prose
# Rows twice as long, twice phase 3's updates, drills whose facts are also the user's details.
LONG_ROWS3 = dataclasses.replace(ROWS3, length=1024, gap_max=900, update_prob=0.16)
LONG_DRILL = dataclasses.replace(KEY_DRILL, length=1024, drill_slots=0.4, drill_updates=0.5)


def _phase5() -> list[Stage]:
    def sched(total: int) -> Schedule:
        return Schedule(lr=1e-3, warmup=20, total=total, decay=0.25)

    return [
        Stage("p5.bind", 5, KeyDrills(BIND, keys="phase2"), 7373, (0, 450), sched(450), focus=("digit",), focus_only=True,
              check="keys"),
        Stage("p5.decide", 5, KeyDrills(KEY_DRILL, keys="real"), 7979, (0, 1200), sched(1200), focus=DECISION, focus_only=True,
              check="keys"),
        Stage("p5.mix", 5, KeyDrills(KEY_DRILL, shares=MIX, rows3=ROWS3), 8484, (0, 700), sched(700), focus=DECISION, check="keys"),
        Stage("p5.long", 5, KeyDrills(LONG_DRILL, shares=MIX, rows3=LONG_ROWS3), 9191, (0, 1000), sched(1000), focus=DECISION,
              check="keys"),
    ]


PLAN: tuple[Stage, ...] = (*_phase1(), *_phase2(), P3_STAGE, *_phase5())


def scaled(plan: tuple[Stage, ...], factor: float) -> tuple[Stage, ...]:
    """The plan with every stage's steps (and so its data) scaled by `factor`, at least one
    step each; runs stay contiguous. For smoke runs: `factor` 1 is the plan itself."""
    if factor == 1:
        return plan
    out: list[Stage] = []
    for s in plan:
        start = out[-1].steps[1] if s.resume and out else 0
        end = start + max(1, round(s.n_steps * factor))
        total = max(end, round(s.schedule.total * factor))
        out.append(dataclasses.replace(s, steps=(start, end), schedule=dataclasses.replace(s.schedule, total=total)))
    return tuple(out)
