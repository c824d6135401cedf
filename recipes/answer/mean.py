"""The mean of LoRA deltas along one run's path: each factor averaged, key by key.

    python -m recipes.answer.mean RUN_B/delta.safetensors RUN_C/delta.safetensors --out mean.safetensors

Run 3c continued run 3b's adapters, so the two deltas are points on one path; their factors'
mean is a rank-r delta between them (not the mean of the two products B @ A, which would
take rank 2r and twice the bytes). Issue 36 ships the mean of run 3b and run 3c: run 3c
traded recall for "not told", and the mean kept the better of each (ANSWER.md, "Run 3c").
Only "lora" deltas with the same keys and shapes are averaged; anything else is refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from agent.runtime.delta import DeltaError, read_delta, write_delta


def mean_lora(paths: list[Path]) -> dict[str, torch.Tensor]:
    if len(paths) < 2:
        raise DeltaError("give at least two deltas to average")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise DeltaError(f"{missing[0]}: no such file; give the delta.safetensors of each run")
    deltas = [read_delta(p, ("lora",))[0] for p in paths]
    first = deltas[0]
    for p, d in zip(paths[1:], deltas[1:]):
        if d.keys() != first.keys():
            raise DeltaError(f"{p}: its tensors are not those of {paths[0]}; only deltas of one run's path average")
        bad = [k for k in first if d[k].shape != first[k].shape]
        if bad:
            raise DeltaError(f"{p}: {bad[0]} is {tuple(d[bad[0]].shape)}, not {tuple(first[bad[0]].shape)} (another rank?)")
    return {k: (sum(d[k].double() for d in deltas) / len(deltas)).to(first[k].dtype) for k in first}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("deltas", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        tensors = mean_lora(a.deltas)
    except DeltaError as e:
        raise SystemExit(f"error: {e}") from None
    write_delta(a.out, tensors, "lora", {"note": "mean of the LoRA factors of " + ", ".join(f"{p.parent.name}/{p.name}" for p in a.deltas)})
    print(f"wrote {a.out}: the mean of {len(a.deltas)} deltas' factors ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
