"""`laplace bench` training numbers: tokens/s, optimizer share, Muon vs AdamW-only, a
domain fine-tune before/after, and distributed-Muon traffic factors.

Corpora come from files already on this machine (nothing is downloaded): "general" text
is Python standard-library source, the "domain" is the package descriptions (METADATA,
mostly English/Markdown prose) of the installed Python packages, split by file into
train and held-out parts.
"""

from __future__ import annotations

import sysconfig
import tempfile
from pathlib import Path
from typing import Any

GENERAL_MODULES = ("json", "logging", "http", "email", "unittest", "asyncio", "argparse.py", "textwrap.py", "pathlib.py", "csv.py")


def _write_corpora(root: Path, general_bytes: int, domain_bytes: int) -> dict[str, Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    general = root / "general"
    general.mkdir()
    total = 0
    for name in GENERAL_MODULES:
        for f in sorted((stdlib / name).rglob("*.py")) if (stdlib / name).is_dir() else [stdlib / name]:
            if total >= general_bytes or not f.is_file():
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            (general / f"{f.parent.name}_{f.stem}.txt").write_text(text, encoding="utf-8")
            total += len(text)
    purelib = Path(sysconfig.get_paths()["purelib"])
    metas = sorted(p for p in purelib.glob("*.dist-info/METADATA") if p.stat().st_size > 2000)
    train, held = root / "domain_train", root / "domain_eval"
    train.mkdir()
    held.mkdir()
    total = 0
    for i, p in enumerate(metas):
        if total >= domain_bytes:
            break
        text = p.read_text(encoding="utf-8", errors="replace")[:20000]
        (held if i % 5 == 4 else train).joinpath(p.parent.name + ".txt").write_text(text, encoding="utf-8")
        total += len(text)
    return {"general": general, "domain_train": train, "domain_eval": held}


def _tiny_or_preset(name: str) -> Any:
    from agent.runtime.checkpoint import LoadedModel, load_model
    from agent.runtime.config import get_preset
    from agent.runtime.model import build_model
    from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer

    if name == "tiny":
        return load_model("tiny")
    # Untrained larger preset with the byte tokenizer (ids < 264 fit any vocabulary).
    return LoadedModel(build_model(get_preset(name), seed=0), byte_level_tokenizer(), ChatTemplate(), name=name)


def _run(cfg_kwargs: dict[str, Any], base: Any = None) -> dict[str, Any]:
    from agent.train.config import TrainConfig
    from agent.train.loop import Trainer

    return Trainer(TrainConfig(**cfg_kwargs), base=base).run()


def throughput(preset: str, data: Path, out: Path, *, seq_len: int, rows: int, steps: int) -> dict[str, Any]:
    """Training tokens/s and optimizer share of step time, Muon+AdamW vs AdamW only
    (steps after the first, which pays one-time allocation costs)."""
    res: dict[str, Any] = {"preset": preset, "seq_len": seq_len, "rows_per_step": rows}
    for opt in ("muon", "adamw"):
        from agent.train.config import TrainConfig
        from agent.train.loop import Trainer

        t = Trainer(TrainConfig(data=(str(data),), out=str(out / f"{preset}-{opt}"), steps=steps + 1, seq_len=seq_len,
                                batch_tokens=seq_len * rows, lr=1e-3, optimizer=opt), base=_tiny_or_preset(preset))
        t.run()
        h = t.history[1:]
        step_s = sum(m["step_s"] for m in h)
        res[opt] = {"tokens_per_s": round(seq_len * rows * len(h) / step_s, 1), "optimizer_share": round(sum(m["optimizer_s"] for m in h) / step_s, 4),
                    "step_s": round(step_s / len(h), 4)}
    return res


def muon_vs_adamw(corpora: dict[str, Path], out: Path, *, steps: int) -> dict[str, Any]:
    """Same tiny model, data, budget and schedule; best learning rate of a small grid each."""
    res: dict[str, Any] = {"steps": steps, "tokens": steps * 8 * 128}
    for opt, lrs in (("muon", (1e-3, 3e-3)), ("adamw", (3e-3, 1e-2))):
        runs = {}
        for lr in lrs:
            s = _run(dict(data=(str(corpora["general"]),), out=str(out / f"cmp-{opt}-{lr}"), steps=steps, seq_len=128, batch_tokens=8 * 128,
                          lr=lr, optimizer=opt, eval=(str(corpora["domain_eval"]),), eval_every=steps, eval_rows=32))
            runs[str(lr)] = round(s["eval_loss"], 4)
        res[opt] = {"eval_loss_by_lr": runs, "best_eval_loss": min(runs.values())}
    return res


def domain_finetune(corpora: dict[str, Path], out: Path, *, pre_steps: int, ft_steps: int) -> dict[str, Any]:
    """Pretrain tiny on general text, then fine-tune on the domain; held-out domain eval loss."""
    common = dict(seq_len=128, batch_tokens=8 * 128, eval_rows=32)
    pre = _run(dict(data=(str(corpora["general"]),), out=str(out / "pre"), steps=pre_steps, lr=3e-3, **common))
    ft = _run(dict(data=(str(corpora["domain_train"]),), base=str(out / "pre"), out=str(out / "ft"), steps=ft_steps, lr=1e-3,
                   eval=(str(corpora["domain_eval"]),), eval_every=ft_steps, **common))
    st = _run(dict(data=(str(corpora["domain_train"]),), base=str(out / "pre"), out=str(out / "ft-state"), steps=ft_steps, lr=3e-2,
                   tune="state", eval=(str(corpora["domain_eval"]),), eval_every=ft_steps, **common))
    return {"pretrain_loss": round(pre["final_loss"], 4), "domain_eval_before": round(ft["eval_loss_start"], 4),
            "domain_eval_after_tune_all": round(ft["eval_loss"], 4), "domain_eval_after_tune_state": round(st["eval_loss"], 4),
            "finetune_steps": ft_steps}


def traffic() -> dict[str, Any]:
    from agent.runtime.config import get_preset
    from agent.runtime.model import build_model
    from agent.train.dist_muon import traffic_bytes
    from agent.train.optim import split_parameters

    res = {}
    for preset in ("tiny", "laplace-3b"):
        shapes = [tuple(p.shape) for _, p in split_parameters(build_model(get_preset(preset), device="meta")).muon]
        res[preset] = {w: {"saving_factor": round(t["saving_factor"], 3), "all_to_all_bytes_per_rank_max": max(t["all_to_all_per_rank"]),
                           "all_gather_bytes_per_rank_max": max(t["all_gather_per_rank"])}
                       for w in (2, 4, 8, 64) for t in [traffic_bytes(shapes, w)]}
    return res


def run_train_bench(quick: bool = True) -> dict[str, Any]:
    """All training benchmarks; `quick` shrinks every budget (a smoke run of a minute or two)."""
    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="laplace-bench-train-") as tmp:
        root = Path(tmp)
        corpora = _write_corpora(root, general_bytes=300_000 if quick else 1_500_000, domain_bytes=150_000 if quick else 600_000)
        out = root / "runs"
        result: dict[str, Any] = {"quick": quick, "threads": torch.get_num_threads()}
        result["throughput"] = [
            throughput("tiny", corpora["general"], out, seq_len=256, rows=8, steps=3 if quick else 10),
            throughput("laplace-small", corpora["general"], out, seq_len=512 if quick else 2048, rows=2, steps=2 if quick else 3),
        ]
        result["muon_vs_adamw"] = muon_vs_adamw(corpora, out, steps=20 if quick else 150)
        result["domain_finetune"] = domain_finetune(corpora, out, pre_steps=20 if quick else 200, ft_steps=10 if quick else 60)
        result["traffic"] = traffic()
    return result


if __name__ == "__main__":  # pragma: no cover - manual runs
    import json
    import sys

    print(json.dumps(run_train_bench(quick="--full" not in sys.argv), indent=2))
