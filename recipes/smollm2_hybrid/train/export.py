"""Take the trained GLA branch out of a transfer run: a small file of it, and a model
directory with it in place of the import's initial branch.

    python -m recipes.smollm2_hybrid.train.export --run RUN_DIR [--file gla_branch.safetensors] [--into MODEL_DIR]
    python -m recipes.smollm2_hybrid.train.export --branch gla_branch.safetensors --into MODEL_DIR

The file holds exactly the model's `blocks.{i}.attn.gla_branch.*` tensors (fp32: what was
trained is what is measured and shipped), with the run's step and tokens in its metadata.
It is a "replace" delta (agent/runtime/delta.py), the form the default model's build reads
as the shipped `gla_branch.safetensors`; `--branch OLD --file NEW` rewrites a file written
before that in this form.
`--into` rewrites MODEL_DIR/model.safetensors with those tensors in place (every name must
already be there with the same shape: a strict swap, nothing else changes).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from safetensors.torch import load_file, save_file

from agent.runtime.delta import write_delta


def branch_of_run(run: Path) -> tuple[dict, dict[str, str]]:
    """The branch tensors of RUN_DIR's checkpoint (Adam's moments left out) and metadata."""
    meta = json.loads((run / "branch.json").read_text())
    tensors = {k: v for k, v in load_file(str(run / "branch.safetensors")).items() if ".gla_branch." in k and not k.startswith("adam.")}
    info = {"kind": "laplace-gla-branch/1", "step": str(meta["step"]), "tokens_seen": str(meta.get("tokens_seen", "")),
            "recipe": "recipes.smollm2_hybrid.train.transfer"}
    return tensors, info


def swap_into(model_dir: Path, tensors: dict) -> None:
    """Replace the branch tensors of a model directory's weights, strictly."""
    path = model_dir / "model.safetensors"
    weights = load_file(str(path))
    for name, t in tensors.items():
        if name not in weights or weights[name].shape != t.shape:
            raise ValueError(f"{model_dir}: no tensor {name} of shape {tuple(t.shape)} to replace")
        weights[name] = t.to(weights[name].dtype)
    save_file(weights, str(path.with_suffix(".tmp")))
    os.replace(path.with_suffix(".tmp"), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=Path, help="a transfer run's folder")
    src.add_argument("--branch", type=Path, help="a branch file this script wrote")
    ap.add_argument("--file", type=Path)
    ap.add_argument("--into", type=Path)
    args = ap.parse_args()
    if args.run:
        tensors, info = branch_of_run(args.run)
    else:
        from safetensors import safe_open

        with safe_open(str(args.branch), "pt") as f:
            info = dict(f.metadata() or {})
        tensors = load_file(str(args.branch))
    if args.file:
        write_delta(args.file, tensors, "replace", metadata={k: v for k, v in info.items() if k != "format"})
        print(f"wrote {args.file}: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values()):,} parameters, "
              f"step {info['step']}")
    if args.into:
        swap_into(args.into, tensors)
        print(f"swapped the branch of step {info['step']} into {args.into}")


if __name__ == "__main__":
    main()
