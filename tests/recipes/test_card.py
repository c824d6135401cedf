"""card.py folds a two-phase recipe's history into one-line card entries."""

from __future__ import annotations

import json
from pathlib import Path

from recipes.demo_model.card import update_card


def _eval(work: Path) -> None:
    rates = {"0": 1.0, "256": 0.875, "512": 0.75}
    work.mkdir()
    (work / "eval.json").write_text(json.dumps({
        "recall": {"recall_5digit": rates, "not_told": rates, "update_stale": {"0": 0.0, "256": 0.125, "512": 0.25},
                   "refused_stated": {"0": 0.0, "256": 0.125, "512": 0.25},
                   "keys_right": {"0": 0.5, "256": 0.5}, "keys_swapped": {"0": 0.375, "256": 0.5}},
        "end_of_turn": {"ended_within_200": 1.0}, "ppl": 120.5}))


def _fold(tmp_path: Path, card: dict, model_config: dict | None = None) -> dict:
    """update_card on a model directory holding `card` (and `model_config`) and a work folder
    holding _eval's eval.json."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"card": card, "model": model_config or {}}))
    _eval(tmp_path / "work")
    return update_card(model, tmp_path / "work", None)


def test_phase2_card_keeps_phase1_lines_and_summarizes_the_cycles(tmp_path: Path) -> None:
    given = {"curriculum": "256x250 -> 256dx150", "go_no_go": "step 250: 0.00", "ppl_vs_softmax": "GLA 118 vs softmax 128",
             "tokens_per_s": 2129}
    blocks = [("rows512", 512, 80), ("rows1024", 1024, 80), ("drill256", 256, 40)]
    stages: list[dict] = [{"phase": 1, "from_model": "/x", "card": given, "log": None}]
    step = 0
    for cycle in range(2):
        for name, length, n in blocks:
            stages.append({"phase": 2, "cycle": cycle, "block": name, "data": {"length": length}, "steps": [step, step + n],
                           "tokens_per_s": 4402})
            step += n
        stages[-1]["validation"] = {"step": step, "score": 0.5 + cycle / 10}
    stages.append({"phase": 2, "block": "polish", "data": {"length": 256}, "steps": [0, 50], "lr": 3e-4, "tokens_per_s": 4402})
    card = {"name": "default", "stages": stages, "eval": {}, "data": {"english": "..."}, "phase2": {"steps": step}, "tokens_per_s": 4402}
    out = _fold(tmp_path, card)
    assert out["curriculum"] == given["curriculum"] and out["go_no_go"] == given["go_no_go"]
    assert out["ppl_vs_softmax"] == given["ppl_vs_softmax"]
    assert out["heldout_two_codes"] == "right/swapped 0:0.50/0.38 256:0.50/0.50"
    assert out["curriculum_phase2"] == "2 cycles of 512x80 -> 1024x80 -> 256x40 (400 steps), then a 50-step drill with more text at lr 0.0003 decaying to 0"
    assert out["phase2_validation"] == "200:0.50 400:0.60"
    assert out["tokens_per_s"] == "phase 1: 2129, phase 2: 4402"
    assert out["heldout_recall_5digit"] == "0:1.00 256:0.88 512:0.75"
    assert "stages" not in out and json.loads((tmp_path / "model" / "training_log.json").read_text())["stages"] == stages
    assert "curriculum_phase3" not in out and "pydoc" not in out["data"]


def test_phase3_adds_its_line_its_speed_and_its_prose_sources(tmp_path: Path) -> None:
    given = {"curriculum": "256x250", "go_no_go": "step 250: 0.00", "tokens_per_s": 2129}
    stages: list[dict] = [{"phase": 1, "from_model": "/x", "card": given, "log": None},
                          {"phase": 2, "cycle": 0, "block": "rows512", "data": {"length": 512}, "steps": [0, 80], "tokens_per_s": 4000,
                           "validation": {"step": 80, "score": 0.5}},
                          {"phase": 3, "block": "ghosts+prose", "data": {"length": 512, "text_chars": 3038704}, "steps": [0, 1800], "lr": 4e-4,
                           "text_share": 0.3, "tokens_per_s": 3900}]
    card = {"name": "default", "stages": stages, "eval": {}, "data": {"english": "..."}, "phase3": {"steps": 1800}, "tokens_per_s": 3950}
    out = _fold(tmp_path, card)
    assert out["curriculum_phase3"] == ("1800 steps of rows of 512 with never-stated questions asked like stated ones, plus 3.04 M characters of prose, "
                                        "lr 0.0004 (WSD)")
    assert out["tokens_per_s"] == "phase 1: 2129, phase 2: 4000, phase 3: 3900"
    assert "pydoc topics" in out["data"] and "torch" in out["data"]


def test_phase5_adds_its_blocks_their_last_checks_and_the_refusals_of_stated_facts(tmp_path: Path) -> None:
    given = {"curriculum": "256x250", "go_no_go": "step 250: 0.00", "tokens_per_s": 2129}
    forced = {"step": 450, "bind_right": 0.7, "bind_other": 0.25, "bind_right_wins": 0.75, "refusal_auc": 0.5}
    stages: list[dict] = [{"phase": 1, "from_model": "/x", "card": given, "log": None},
                          {"phase": 5, "block": "bind", "steps": [0, 450], "rows": 256, "lr": 1e-3, "tokens_per_s": 4300, "checks": [forced]},
                          {"phase": 5, "block": "decide", "steps": [0, 450], "rows": 512, "lr": 1e-3, "tokens_per_s": 4300,
                           "checks": [{**forced, "refusal_auc": 0.8}]},
                          {"phase": 5, "block": "mix", "steps": [0, 700], "rows": 512, "lr": 1e-3, "tokens_per_s": 4100,
                           "checks": [{**forced, "step": 700, "bind_right": 0.8, "refusal_auc": 0.85, "not_told": 0.9, "refused_stated": 0.0}]},
                          {"phase": 5, "block": "decide", "steps": [0, 300], "rows": 512, "lr": 1e-3, "tokens_per_s": 4300,
                           "data": {"keys": "real"}, "checks": [forced]},
                          {"phase": 5, "block": "long", "steps": [0, 1000], "rows": 1024, "lr": 1e-3, "tokens_per_s": 4100,
                           "checks": [{**forced, "step": 1000, "not_told": 0.75, "refused_stated": 0.1}]}]
    card = {"name": "default", "stages": stages, "eval": {}, "data": {"english": "..."},
            "phase5": {"steps": 2900, "bind": 450, "decide": 450, "mix": 700, "long": 1000}, "tokens_per_s": 4000}
    out = _fold(tmp_path, card)
    assert out["curriculum_phase5"] == (
        "450 steps of key drills, loss on the values' first digits only, rows of 256, lr 0.001 (WSD): binding 0.70/0.25, "
        "refusal AUC 0.50; "
        "450 steps of key drills with made-up key words, loss on the decision tokens only, rows of 512, lr 0.001 (WSD): "
        "binding 0.70/0.25, refusal AUC 0.80; "
        "700 steps of phase-3 rows, key drills and prose, rows of 512, lr 0.001 (WSD): binding 0.80/0.25, refusal AUC 0.85, "
        "at 0 tokens not told 0.90 and stated refused 0.00; "
        "300 steps of key drills with phase 3's key words, loss on the decision tokens only, rows of 512, lr 0.001 (WSD): "
        "binding 0.70/0.25, refusal AUC 0.50; "
        "1000 steps of phase-3 rows with twice the updates, key drills of codes and the user's own details, and prose, rows of 1024, "
        "lr 0.001 (WSD): binding 0.70/0.25, refusal AUC 0.50, at 0 tokens not told 0.75 and stated refused 0.10")
    assert out["tokens_per_s"] == "phase 1: 2129, phase 5: 4220"
    assert out["data"].endswith("key drills with made-up key words in phase 5")
    assert out["heldout_refused_stated"] == "0:0.00 256:0.12 512:0.25"
