"""The demo model's plan (recipes/demo_model/plan.py) against the shipped card and log,
the data of every stage, the recipe's imports, and its build command."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from agent.runtime.checkpoint import load_model_dir
from recipes.demo_model.build import Build, main
from recipes.demo_model.corpus import Passage
from recipes.demo_model.plan import DRILL, PLAN, Chat, scaled

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "agent" / "models" / "demo"
CARD = json.loads((DEFAULT / "config.json").read_text(encoding="utf-8"))["card"]
LOG = json.loads((DEFAULT / "training_log.json").read_text(encoding="utf-8"))


def phase(n: int) -> list:
    return [s for s in PLAN if s.phase == n]


def test_phase1_is_the_cards_curriculum_and_its_go_no_go_checks() -> None:
    p1 = phase(1)
    line = " -> ".join(f"{s.rows}{'d' if isinstance(s.data, Chat) and s.data.spec == DRILL else ''}x{s.n_steps}" for s in p1)
    assert line + "  (row length x steps; d = dense drill)" == CARD["curriculum"]
    gates = [s.steps[1] for s in p1 if s.check == "gate"]
    assert gates == [int(x) for x in re.findall(r"step (\d+):", CARD["go_no_go"])]
    assert [(c["rows"], tuple(c["gaps"])) for c in LOG["curriculum"]] == [(s.data.spec.length, (s.data.spec.gap_min, s.data.spec.gap_max))
                                                                            for s in p1 if s.name.startswith("p1.rows")]


def test_phase2_is_the_cards_cycles_polish_and_validations() -> None:
    p2 = phase(2)
    cycles = [s for s in p2 if s.name != "p2.polish"]
    first = [s for s in cycles if s.name.startswith("p2.c0.")]
    polish = p2[-1]
    line = (f"{int(cycles[-1].name.split('.')[1][1:]) + 1} cycles of {' -> '.join(f'{s.rows}x{s.n_steps}' for s in first)} "
            f"({cycles[-1].steps[1]} steps), then a {polish.n_steps}-step drill with more text at lr {polish.schedule.lr:g} decaying to 0")
    assert line == CARD["curriculum_phase2"]
    assert polish.schedule.decay == 1.0 and CARD["phase2"]["steps"] == cycles[-1].steps[1]
    assert CARD["phase2"]["polish_steps"] == polish.n_steps
    assert [s.steps[1] for s in cycles if s.check == "validation"] == [int(x.split(":")[0]) for x in CARD["phase2_validation"].split()]


def test_phases_3_and_5_are_the_cards_steps_rows_and_learning_rates() -> None:
    (p3,) = phase(3)
    hit = re.match(r"(\d+) steps of rows of (\d+) .* lr ([\d.]+) \(WSD\)", CARD["curriculum_phase3"])
    assert hit and (p3.n_steps, p3.rows, p3.schedule.lr) == (int(hit[1]), int(hit[2]), float(hit[3]))
    assert CARD["phase3"] == {"steps": p3.n_steps}
    p5 = phase(5)
    assert CARD["phase5"] == {"steps": sum(s.n_steps for s in p5), **{s.name.split(".")[1]: s.n_steps for s in p5}}
    shown = re.findall(r"(\d+) steps of [^;]*?rows of (\d+), lr ([\d.]+) \(WSD\)", CARD["curriculum_phase5"])
    assert [(int(n), int(r), float(lr)) for n, r, lr in shown] == [(s.n_steps, s.rows, s.schedule.lr) for s in p5]
    assert sum(s.n_steps for s in PLAN) == CARD["training_steps"] and CARD["training_tokens"] == CARD["training_steps"] * 4096


def test_every_stage_is_the_logged_one_its_steps_rows_and_data() -> None:
    logged = LOG["stages"][0]["log"]["stages"] + LOG["stages"][1:]
    assert len(logged) == len(PLAN)
    for s, h in zip(PLAN, logged):
        assert list(s.steps) == h["steps"], s.name
        if s.phase == 1:  # (later phases weighted answers x4 throughout, unrecorded)
            assert h.get("answer_weight", 1.0) == s.answer_weight, s.name
        if "lr" in h:
            assert h["lr"] == s.schedule.lr, s.name
        if isinstance(s.data, Chat):  # its rows, gaps, random stream and dialogue count
            d = h["data"]
            shown = (d["length"], d["gap"], d["stage"], d["dialogues"])
            n = Build.dialogues(s)
            assert shown == (s.rows, [s.data.spec.gap_min, s.data.spec.gap_max], s.data.stream, n), s.name
        else:
            assert (h["block"], h["rows"], h["focus"], h["focus_only"], h["data"]["keys"]) == (
                s.name.split(".")[1], s.rows, list(s.focus), s.focus_only, "fragment" if s.data.keys == "phase2" else s.data.keys), s.name


PASSAGES = [
    Passage("alpha", "module", "The alpha module reads files. It returns the lines it found in them, in the order they were read."),
    Passage("beta", "Thing", "A thing that holds values. Values are kept in the order they were given, and the thing can be copied."),
]


def _digest(folder: Path) -> str:
    d = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        d.update(p.name.encode() + (p.read_bytes() if p.is_file() else b""))
    return d.hexdigest()


def stages_write_the_same_data_for_the_same_seed(build: type[Build], stages: tuple, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> int:
    """Each kind of stage in `stages`, written twice per seed by `build`: the same data for a
    seed, other data for another seed. Returns how many kinds there were."""
    from recipes.demo_model import build as build_module, data

    # Wide prose is the interpreter's and torch's docstrings; two passages stand in for it.
    monkeypatch.setattr(build_module, "wide_text", lambda train: list(train))
    monkeypatch.setattr(data, "wide_text", lambda train: list(train))
    lm = load_model_dir(DEFAULT)
    kinds = {}
    for s in scaled(stages, 1e-9):  # one step each
        kinds.setdefault(s.name.split(".")[-1] if s.phase == 2 else s.name, s)  # phase 2's cycles differ by seed only
    for seed in (0, 1):
        b = build(Namespace(seed=seed, work=str(tmp_path), eval_trials=1), (), passages=PASSAGES * 3)
        for key, s in kinds.items():
            b.data(s, tmp_path / f"{seed}a" / s.name, lm)
            b.data(s, tmp_path / f"{seed}b" / s.name, lm)
    for s in kinds.values():
        assert _digest(tmp_path / "0a" / s.name) == _digest(tmp_path / "0b" / s.name), s.name
        assert _digest(tmp_path / "0a" / s.name) != _digest(tmp_path / "1a" / s.name), s.name  # the seed matters
    return len(kinds)


def test_each_kind_of_stage_writes_the_same_data_for_the_same_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stages_write_the_same_data_for_the_same_seed(Build, PLAN, tmp_path, monkeypatch) == 11 + 5 + 1 + 4


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_recipe_has_no_import_cycle_nor_experiment_and_the_package_never_imports_it() -> None:
    mods = {f"recipes.demo_model.{p.stem}": p for p in (ROOT / "recipes" / "demo_model").glob("*.py")}
    graph = {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}
    assert not [m for m, p in mods.items() if any(i.startswith("recipes.experiments") for i in _imports(p))]

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        for n in graph[m]:
            visit(n, (*path, m))

    for m in graph:
        visit(m, ())
    users = [str(p) for p in (ROOT / "agent").rglob("*.py") if any(i.split(".")[0] == "recipes" for i in _imports(p))]
    assert not users


@pytest.mark.parametrize("args, message", [
    (["--stop-after-stage", "p4.bridge"], "--stop-after-stage: no stage 'p4.bridge' in the plan"),
    (["--steps-scale", "0"], "--steps-scale must be positive"),
    (["--eval-trials", "0"], "--eval-trials must be >= 1"),
    (["--stop-after-stage", "p6.natural512"], "--stop-after-stage: no stage 'p6.natural512' in the plan"),  # an experiment's
    (["--from-model", "x"], "unrecognized arguments: --from-model"),  # recipes/experiments/phase6.py's flag
    ([], "the following arguments are required: --out"),
])
def test_bad_build_arguments_fail_in_one_line_before_any_work(args, message, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["--work", str(tmp_path / "work"), *args] + ([] if not args else ["--out", str(tmp_path / "out")]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 72 stages, each a trainer start, its data and its check: ~12 minutes on 2 shared cores
def test_a_smoke_build_of_the_whole_plan_writes_a_loadable_model_with_its_card(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recipes.demo_model.build", "--tiny", "--steps-scale", "0.001", "--eval-trials", "1",
           "--threads", "2", "--work", str(tmp_path / "work"), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800, cwd=ROOT)
    card = load_model_dir(out).card
    assert [h["name"] for h in card["stages"]] == [s.name for s in PLAN]
    assert card["training_steps"] == sum(s.n_steps for s in scaled(PLAN, 0.001))
    by_name = {h["name"]: h for h in card["stages"]}
    last_cycle = [h for h in card["stages"] if h["phase"] == 2][-2]  # the block before the polish
    assert card["phase5"]["bind"] == 1 and "validation" in last_cycle and "checks" in by_name["p5.long"]
    assert card["recipe"] == "python -m recipes.demo_model.build --seed 0"
