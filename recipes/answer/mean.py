"""The mean of LoRA deltas along one run's path: each factor averaged, key by key; or, with
`--soup`, the mean of the deltas themselves (any runs from the same base).

    python -m recipes.answer.mean RUN_B/delta.safetensors RUN_C/delta.safetensors --out mean.safetensors
    python -m recipes.answer.mean --soup A/delta.safetensors C/delta.safetensors --out soup.safetensors [--half]
    python -m recipes.answer.mean --soup D/delta.safetensors --rank w1=24,w2=24,w3=24 --out cut.safetensors
    python -m recipes.answer.mean --sum cut.safetensors RUN_QK/delta.safetensors --out both.safetensors

Run 3c continued run 3b's adapters, so the two deltas are points on one path; their factors'
mean is a rank-r delta between them (not the mean of the two products B @ A, which would
take rank 2r and twice the bytes). Issue 36 ships the mean of run 3b and run 3c: run 3c
traded recall for "not told", and the mean kept the better of each (ANSWER.md, "Run 3c").
Only "lora" deltas with the same keys and shapes are averaged; anything else is refused.

`--soup` is for runs that share only the base (a weight-space "model soup"): the delta whose
change to each weight is the mean of the runs' changes, (B1 A1 + ... + Bn An) / n, written
exactly as a LoRA pair of the summed rank (the A's stacked, the B's side by side and scaled
by 1/n). A key only some runs adapt gets its mean with the others' zero change. `--rank R`
keeps the best rank-R approximation of each mean change instead (truncated SVD); `--rank
w1=24,w2=24` cuts only those targets (a key's module name: `blocks.3.ffn.w1.weight` is `w1`), and
`32,w1=24` cuts the rest to 32. With `--rank`, one delta is enough: it is cut alone (so an
MLP rank can make room within the 16 MB budget for adapters on other targets). `--sum` is
`--soup` without the 1/n: the sum of the changes, for a run trained on a model with another
delta merged into its weights (that delta plus the run's adapters is the run's model). `--half`
stores the factors in float16, half the bytes (two rank-16 runs: rank 32 in the bytes of one
rank-16 float32 delta); applying a delta computes in float32 either way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from agent.runtime.delta import DeltaError, lora_pairs, read_delta, write_delta


def _read_loras(paths: list[Path], what: str, least: int = 2, hint: str = "") -> list[dict[str, torch.Tensor]]:
    """Each path's "lora" delta tensors; at least `least` paths, every one a file."""
    if len(paths) < least:
        raise DeltaError(f"give at least two deltas to {what}{hint}")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise DeltaError(f"{missing[0]}: no such file; give the delta.safetensors of each run")
    return [read_delta(p, ("lora",))[0] for p in paths]


def mean_lora(paths: list[Path]) -> dict[str, torch.Tensor]:
    deltas = _read_loras(paths, "average")
    first = deltas[0]
    for p, d in zip(paths[1:], deltas[1:]):
        if d.keys() != first.keys():
            raise DeltaError(f"{p}: its tensors are not those of {paths[0]}; only deltas of one run's path average")
        bad = [k for k in first if d[k].shape != first[k].shape]
        if bad:
            raise DeltaError(f"{p}: {bad[0]} is {tuple(d[bad[0]].shape)}, not {tuple(first[bad[0]].shape)} (another rank?)")
    return {k: (sum(d[k].double() for d in deltas) / len(deltas)).to(first[k].dtype) for k in first}


def _target(key: str) -> str:
    """The LoRA target a weight key belongs to: "blocks.3.ffn.w1.weight" -> "w1"."""
    return key.removesuffix(".weight").rsplit(".", 1)[-1]


def parse_ranks(text: str) -> dict[str, int]:
    """`--rank`: "R" (every key), "TARGET=R,..." (those targets), or both ("32,w1=24"); the
    rank for every key is under "", for a target under its name."""
    ranks: dict[str, int] = {}
    for item in (i.strip() for i in str(text).split(",") if i.strip()):
        name, sep, value = item.rpartition("=")
        if (sep and not name.strip()) or not value.strip().isdigit() or int(value) < 1:
            raise DeltaError(f"--rank {text!r}: give a rank R >= 1, TARGET=R pairs, or both (e.g. 32,w1=24)")
        ranks[name.strip()] = int(value)
    if not ranks:
        raise DeltaError(f"--rank {text!r}: give a rank R >= 1, TARGET=R pairs, or both (e.g. 32,w1=24)")
    return ranks


def soup_lora(paths: list[Path], dtype: torch.dtype = torch.float32, rank: int | dict[str, int] | None = None,
              total: bool = False) -> dict[str, torch.Tensor]:
    """The mean of the deltas' changes (`total`: their sum), each key cut to its `rank`."""
    ranks = {"": rank} if isinstance(rank, int) else dict(rank or {})
    pairs = [lora_pairs(d) for d in _read_loras(paths, "mix", least=1 if ranks else 2, hint=" (or one with --rank, to cut it)")]
    named = {_target(k) for d in pairs for k in d}
    unknown = sorted(set(ranks) - named - {""})
    if unknown:
        raise DeltaError(f"--rank names {unknown[0]!r}, which no delta adapts (they adapt {', '.join(sorted(named))})")
    out: dict[str, torch.Tensor] = {}
    for key in sorted(set().union(*pairs)):
        have = [d[key] for d in pairs if key in d]
        shapes = {(a.shape[1], b.shape[0]) for a, b in have}
        if len(shapes) > 1:
            raise DeltaError(f"{key}: the runs adapt it with different shapes {sorted(shapes)}; they are not of one base")
        a = torch.cat([a.double() for a, _ in have])
        b = torch.cat([b.double() for _, b in have], 1) / (1 if total else len(paths))
        r = ranks.get(_target(key), ranks.get(""))
        if r is not None and r < a.shape[0]:
            a, b = _truncate(a, b, r)
        out[key + ".lora_A"], out[key + ".lora_B"] = a.to(dtype), b.to(dtype)
    return out


def _truncate(a: torch.Tensor, b: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best rank-`rank` approximation of b @ a (truncated SVD, through the QR factors of
    the two thin matrices, so the full weight-sized product is never formed), split evenly."""
    qb, rb = torch.linalg.qr(b)  # b = qb rb
    qa, ra = torch.linalg.qr(a.T)  # a = ra^T qa^T
    u, s, vh = torch.linalg.svd(rb @ ra.T)
    root = s[:rank].sqrt()
    return (root[:, None] * (vh[:rank] @ qa.T)), ((qb @ u[:, :rank]) * root)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("deltas", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--soup", action="store_true", help="the mean of the deltas (B A), not of their factors: runs that share only the base")
    ap.add_argument("--sum", action="store_true", help="the sum of the deltas' changes, not their mean (--soup without the 1/n)")
    ap.add_argument("--half", action="store_true", help="store the factors in float16")
    ap.add_argument("--rank", help="--soup: keep the best rank-R approximation of each mean (truncated SVD); "
                    "R, TARGET=R pairs (w1=24,w2=24), or both (32,w1=24)")
    a = ap.parse_args(argv)
    names = ", ".join(f"{p.parent.name}/{p.name}" for p in a.deltas)
    try:
        if a.rank is not None and not (a.soup or a.sum):
            raise DeltaError("--rank cuts a soup's ranks; use it with --soup or --sum")
        if a.soup or a.sum:
            tensors = soup_lora(a.deltas, torch.float16 if a.half else torch.float32,
                                None if a.rank is None else parse_ranks(a.rank), total=a.sum)
        else:
            tensors = mean_lora(a.deltas)
            if a.half:
                tensors = {k: v.half() for k, v in tensors.items()}
    except DeltaError as e:
        raise SystemExit(f"error: {e}") from None
    what = ("the delta cut" if len(a.deltas) == 1 else "the sum of the deltas" if a.sum else "the mean of the deltas") \
        if a.soup or a.sum else "the mean of the LoRA factors"
    write_delta(a.out, tensors, "lora", {"note": f"{what} of {names}" + (f" (--rank {a.rank})" if a.rank else "")})
    print(f"wrote {a.out}: {what}" + (f" to rank {a.rank}" if len(a.deltas) == 1 else f" of {len(a.deltas)} deltas")
          + f" ({len(tensors)} tensors, {a.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
