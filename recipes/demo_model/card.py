"""Fold the evaluation results into the shipped model's card, in lines `laplace info` shows.

    python -m recipes.demo_model.card --model agent/models/demo --work /tmp/laplace-default-build \
        --probe docs/demo-model-probe.json

Reads the recipe's eval.json / baseline.json and a `laplace probe run --json` report, and
rewrites only the card inside config.json (the weights, and so the fingerprint's weight
digest, are untouched; the card is not part of the fingerprint).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def probe_table(report: dict[str, Any], probe: str = "passkey") -> dict[str, dict[int, dict[str, float]]]:
    """{filler: {distance: {exact, top1}}} for one probe."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for c in report["cells"]:
        if c["probe"] == probe:
            out.setdefault(c["filler"], {})[c["distance"]] = {"exact": c["exact"], "top1": c["top1"],
                                                              "digits": c.get("exact_by_kind", {}).get("digits")}
    return out


def probe_summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    keep = ("probe", "filler", "d50", "h90", "ledger_d50", "competent")
    return [{k: s.get(k) for k in keep} for s in report["summaries"]]


def _fmt(rates: dict[Any, float], ds: tuple[int, ...] = (0, 256, 512, 1024, 2048)) -> str:
    return " ".join(f"{d}:{rates[d]:.2f}" for d in ds if d in rates)


def update_card(model_dir: Path, work: Path, probe_json: Path | None, *, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rewrite the card in `model_dir`'s config.json from the build's records and return it.
    `record`: the training log of the model a run was continued from (an experiment's, such
    as recipes/experiments/phase6.py); this run's stages follow its stages."""
    cfg_path = model_dir / "config.json"
    meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    card = meta["card"]
    # The long records (stages, full eval) go to training_log.json beside the weights; the
    # card keeps one line per fact so `laplace info` stays readable.
    detail = {k: card.pop(k) for k in ("stages", "eval", "schedule_shortened") if k in card}
    if isinstance(card.get("curriculum"), list):
        detail["curriculum"] = card.pop("curriculum")
    log_path = model_dir / "training_log.json"
    if "stages" in detail:  # first run on a fresh recipe output; later runs reuse the file
        if record is not None:
            detail = {**record, **detail, "stages": record["stages"] + detail["stages"]}
        log_path.write_text(json.dumps(detail, indent=2, default=str), encoding="utf-8")
    else:
        detail = json.loads(log_path.read_text(encoding="utf-8"))
    if isinstance(card.get("data"), dict):
        card["data"] = ("Python stdlib docstrings (PSF-2.0, read from the local interpreter)"
                        + (" + pydoc topics (PSF-2.0) and torch's docstrings (BSD-3-Clause) in phase 3" if card.get("phase3") else "")
                        + " + synthetic template dialogues (recipes/demo_model)"
                        + (" + key drills with made-up key words in phase 5" if card.get("phase5") else ""))
    stages = detail.get("stages") or []
    given = next((h for h in stages if h.get("phase") == 1 and "card" in h), None)  # phase 1, recorded by the run that continued from it
    phase2 = [h for h in stages if h.get("phase") == 2]
    phase3 = next((h for h in reversed(stages) if h.get("phase") == 3), None)
    phase5 = [h for h in stages if h.get("phase") == 5]
    if given is not None:
        card["curriculum"] = given["card"].get("curriculum")
        card["go_no_go"] = given["card"].get("go_no_go")
        if given["card"].get("ppl_vs_softmax"):
            card["ppl_vs_softmax"] = given["card"]["ppl_vs_softmax"]
        if given["card"].get("tokens_per_s") and isinstance(card.get("tokens_per_s"), (int, float)):
            later = [(n, [h["tokens_per_s"] for h in hs if h.get("tokens_per_s")])
                     for n, hs in ((2, phase2), (3, [phase3] if phase3 else []), (5, phase5))]
            card["tokens_per_s"] = ", ".join([f"phase 1: {given['card']['tokens_per_s']}"]
                                             + [f"phase {n}: {round(sum(v) / len(v))}" for n, v in later if v])
    else:
        phase1 = [h for h in stages if h.get("phase", 1) == 1]
        card["curriculum"] = " -> ".join(
            f"{h['data']['length']}{'d' if h.get('drill') else ''}x{h['steps'][1] - h['steps'][0]}" for h in phase1 if h["steps"][1] > h["steps"][0]
        ) + "  (row length x steps; d = dense drill)"
        card["go_no_go"] = " ".join(f"step {h['steps'][1]}: {h['gate']['mean']:.2f}" for h in phase1 if "gate" in h) + " (recall at <=128, gate 0.5)"
    if phase2:
        blocks = []
        for h in phase2:
            if h.get("cycle") == 0:
                blocks.append(f"{h['data']['length']}x{h['steps'][1] - h['steps'][0]}")
        cycles = [h for h in phase2 if "cycle" in h]
        polish = next((h for h in phase2 if h.get("block") == "polish"), None)
        card["curriculum_phase2"] = (f"{cycles[-1]['cycle'] + 1} cycles of {' -> '.join(blocks)} ({cycles[-1]['steps'][1]} steps)"
                                     + (f", then a {polish['steps'][1]}-step drill with more text at lr {polish['lr']:g} decaying to 0"
                                        if polish else ""))
        card["phase2_validation"] = " ".join(f"{h['validation']['step']}:{h['validation']['score']:.2f}" for h in cycles if "validation" in h)
    if phase3:
        card["curriculum_phase3"] = (f"{phase3['steps'][1]} steps of rows of {phase3['data']['length']} with never-stated questions "
                                     f"asked like stated ones, plus {phase3['data']['text_chars'] / 1e6:.2f} M characters of prose, "
                                     f"lr {phase3['lr']:g} (WSD)")
    if phase5:
        what = {"bind": "key drills, loss on the values' first digits only",
                "decide": "key drills with {keys} key words, loss on the decision tokens only",
                "mix": "phase-3 rows, key drills and prose",
                "long": "phase-3 rows with twice the updates, key drills of codes and the user's own details, and prose"}
        keys = {"fragment": "made-up", "real": "phase 3's", "phase2": "phase 2's"}

        def last(h: dict[str, Any]) -> str:
            c = h["checks"][-1]
            line = f"binding {c['bind_right']:.2f}/{c['bind_other']:.2f}, refusal AUC {c['refusal_auc']:.2f}"
            if "not_told" in c:
                line += f", at 0 tokens not told {c['not_told']:.2f} and stated refused {c['refused_stated']:.2f}"
            return line

        card["curriculum_phase5"] = "; ".join(
            f"{h['steps'][1]} steps of {what[h['block']].format(keys=keys[h.get('data', {}).get('keys', 'fragment')])}, "
            f"rows of {h['rows']}, "
            f"lr {h['lr']:g} (WSD): " + last(h) for h in phase5)
    ev = json.loads((work / "eval.json").read_text(encoding="utf-8"))
    r = {k: {int(d): v for d, v in ev["recall"][k].items()} for k in ev["recall"] if isinstance(ev["recall"][k], dict)}
    card["heldout_recall_5digit"] = _fmt(r["recall_5digit"])
    card["heldout_not_told"] = _fmt(r["not_told"])
    if "refused_stated" in r:
        card["heldout_refused_stated"] = _fmt(r["refused_stated"])
    card["heldout_stale"] = _fmt(r["update_stale"])
    if "keys_right" in r:  # two codes held, each asked (older eval.json files lack it)
        card["heldout_two_codes"] = "right/swapped " + " ".join(
            f"{d}:{r['keys_right'][d]:.2f}/{r['keys_swapped'][d]:.2f}" for d in (0, 256, 512, 1024, 2048) if d in r["keys_right"])
    card["heldout_end_of_turn"] = ev["end_of_turn"]["ended_within_200"]
    card["heldout_ppl"] = round(ev["ppl"], 2)
    base = work / "baseline.json"
    if base.exists():
        b = json.loads(base.read_text(encoding="utf-8"))
        card["ppl_vs_softmax"] = (f"after {b['tokens']:,} tokens: GLA {b['gla_ppl_same_tokens']:.2f} vs softmax "
                                  f"{b['softmax_ppl']:.2f} (same widths, rows, order, optimizer split)")
    if probe_json is not None:
        rep = json.loads(probe_json.read_text(encoding="utf-8"))
        table = probe_table(rep)
        card["probe_suite"] = f"{rep['suite']['name']} ({rep['suite']['style']}, {rep['suite']['trials']} trials)"
        for filler, by_d in table.items():
            card[f"probe_passkey_{filler}"] = "top-1/exact " + " ".join(
                f"{d}:{v['top1']:.2f}/{v['exact']:.2f}" for d, v in sorted(by_d.items()))
            if all(v["digits"] is not None for v in by_d.values()):
                card[f"probe_passkey_{filler}_5digit_exact"] = " ".join(f"{d}:{v['digits']:.2f}" for d, v in sorted(by_d.items()))
        card["probe_d50"] = {f"{s['probe']}/{s['filler']}": s["d50"] for s in probe_summary(rep) if s["probe"] == "passkey"}
    meta["card"] = card
    cfg_path.write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    return card


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[2] / "agent" / "models" / "demo"))
    ap.add_argument("--work", default="/tmp/laplace-default-build")
    ap.add_argument("--probe", default=None)
    a = ap.parse_args()
    card = update_card(Path(a.model), Path(a.work), Path(a.probe) if a.probe else None)
    print(json.dumps(card, indent=2, default=str)[:4000])


if __name__ == "__main__":
    main()
