"""How far the torch-free engine's state is from the torch runtime's for the same tokens: the
measurement behind `agent.runtime.state_compare.INT8_ROW_TOLERANCE`.

    python -m recipes.experiments.runtime_parity --model DIR --tokens 700 --steps 44

Both runtimes load the model directory (int8: the card's dtype for the default model), fold
the first `--tokens` ids of this repository's README with `prefill`, then step `--steps`
more one at a time; the engine's state crosses into torch's form as its stored bytes, and
`state_compare.compare` gives each part's worst relative row difference. One thread each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from agent.runtime.checkpoint import load_model_dir
from agent.runtime.generation import EagerRunner
from agent.runtime.native.runner import EngineRunner, open_engine_model
from agent.runtime.state import RecurrentState
from agent.runtime.state_compare import compare

README = Path(__file__).resolve().parents[2] / "README.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model directory the engine runs (loaded once with torch before)")
    p.add_argument("--weights", default="int8", choices=("int8", "fp32"))
    p.add_argument("--tokens", type=int, default=700)
    p.add_argument("--steps", type=int, default=44)
    a = p.parse_args()
    torch.set_num_threads(1)
    lm = load_model_dir(a.model, quant="int8" if a.weights == "int8" else None, decode_layout=True)
    em = open_engine_model(Path(a.model), weights=a.weights, threads=1)
    ids = lm.tokenizer.encode(README.read_text(encoding="utf-8"))
    prompt, steps = ids[: a.tokens], ids[a.tokens : a.tokens + a.steps]
    tr, er = EagerRunner(lm.model), EngineRunner(em.engine)
    _, ts = tr.prefill(prompt)
    _, es = er.prefill(prompt)
    for t in steps:
        tr.step_token(t, ts)
        ts.n_tokens += 1
        er.step_token(t, es)
    blob = es.to_bytes(fingerprint=em.fingerprint, architecture=em.config.architecture())
    engine_state = RecurrentState.from_bytes(blob, config=lm.config, fingerprint=lm.fingerprint)
    parts = compare(engine_state, ts)
    print(json.dumps({"model": a.model, "weights": a.weights, "tokens": a.tokens, "steps": len(steps),
                      "parts": {p.name: round(p.worst, 4) for p in parts}, "worst": round(max(p.worst for p in parts), 4)}))


if __name__ == "__main__":
    main()
