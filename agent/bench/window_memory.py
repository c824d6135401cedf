"""`laplace bench window-memory -m MODEL`: what the window mixer's memory of evicted tokens
(`runtime/memory.py`) costs in speed and state, against the window alone in the same run.

Issue 37's floor: decode at most 1.2x the window-only model's time per token, and the whole
state at most 32 MB (MiB, as every MB here) per session.

Variants: `window` (memory_slots 0: the baseline), then `POLICY-M` for each M in
--memory-slots (64,128) and each policy in --policy (recall,attention,novelty). Each runs in its own
child process (`python -m agent.bench.window_memory_child`, so its timings and peak RSS are
its own) on the model loaded as chat loads it, only the config changed, on one runtime for
all (--runtime): `engine`, the torch-free engine chat runs where it can (int8 weights when
the card says int8, else fp32; the "novelty" memory only), or `torch` (the card's dtype; every
policy). By default the engine when it runs every variant (as `cli/chat.py` engine_for
decides: the card's dtype int8 or float32, the policies, the C kernels, the int8 cache), else
torch; the report names the runtime and why. Measured:
- prefill tok/s of a 512-token segment read after --context tokens (2048: past S + W + M,
  so the memory is full and turning over);
- decode tok/s of 128 greedy `step_` steps after that context;
- the state's bytes (`config.state_bytes()`) and the memory's share; the children's peak RSS.

Rounds are interleaved: each of 5 rounds runs every variant's child once, in turn (the order
reversed every other round), and a variant's ratio is the median over the rounds of its time
per token / the window's in the same round. This machine's speed drifts by 10% and more
between minutes (the window alone decoded at 90-103 tok/s in three runs of one day): variants
measured one after another, each over its own rounds, put that drift into their ratio;
paired rounds cancel most of it. Ratios are variant / window of the time per token (above 1:
slower than the window alone); tok/s are each variant's medians over its rounds.
Timings need a quiet machine: as `laplace bench llamacpp` does, the 1-min load average
before the run and other processes' CPU share during each child decide whether any ratio is
valid (`ratios_valid`; the CLI exits 3 when not). The state floor is arithmetic, judged
always; the decode floor only on a valid run. `--quick`: tiny sizes, a correctness run, not
a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agent.bench.llamacpp import settle
from agent.bench.window_memory_child import with_memory
from agent.bench.llamacpp_measure import MeasureError, child_env, run_child
from agent.bench.llamacpp_report import MAX_LOAD, MAX_OTHERS, load_line, load_verdict
from agent.runtime.config import MEMORY_POLICIES  # torch-free

FLOOR_DECODE_TIME = 1.2  # issue 37: decode time per token at most 1.2x the window's
FLOOR_STATE_MB = 32  # issue 37: the whole state per session
POLICIES = MEMORY_POLICIES
DEFAULT_SLOTS = (64, 128)
ROUNDS = 5  # interleaved rounds: each a child per variant (see the module docstring)
RUNTIMES = ("torch", "engine")
QUICK_PAST_FULL = 64  # --quick reads this many tokens past the point where the memory fills
CHILD_TIMEOUT_S = 900.0
MB = 2**20

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Variant:
    slots: int  # M; 0: the window alone
    policy: str | None = None

    @property
    def name(self) -> str:
        return f"{self.policy}-{self.slots}" if self.slots else "window"


WINDOW = Variant(0)


@dataclass(frozen=True)
class Sizes:
    context: int
    prefill: int
    decode: int
    rounds: int


@dataclass(frozen=True)
class Plan:
    model_dir: Path
    variants: tuple[Variant, ...]
    sizes: Sizes
    runtime: str = "torch"  # every child's: "torch" or "engine"
    runtime_why: str = "--runtime torch"


def parse_slots(text: str | None) -> tuple[int, ...]:
    """--memory-slots: memory sizes M like 64,128 (the window alone is always measured)."""
    if text is None:
        return DEFAULT_SLOTS
    try:
        slots = tuple(dict.fromkeys(int(s) for s in text.split(",") if s.strip()))
    except ValueError:
        raise ValueError(f"--memory-slots takes memory sizes like 64,128, got {text!r}") from None
    if not slots or min(slots) < 1:
        raise ValueError(f"--memory-slots takes memory sizes of 1 or more like 64,128 (the window alone, M = 0, is "
                         f"always measured), got {text!r}")
    return slots


def parse_policies(text: str | None) -> tuple[str, ...]:
    """--policy: one or more of recall, attention, novelty, comma-separated."""
    if text is None:
        return POLICIES
    policies = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"--policy takes one or more of {', '.join(POLICIES)} like recall,novelty, got {text!r}")
    return policies


def variants(slots: Sequence[int], policies: Sequence[str]) -> tuple[Variant, ...]:
    """The window first (the baseline), then each M with each policy."""
    return (WINDOW, *(Variant(m, p) for m in slots for p in policies))


def plan(model: str, models_dir: str | Path | None, slots: Sequence[int], policies: Sequence[str], *, quick: bool,
         context: int | None = None, runtime: str | None = None) -> Plan:
    """The model directory, the variants, the sizes and the runtime (`choose_runtime`); a
    ValueError (one line, with the way out) for a model or a choice this bench cannot measure.
    Reads config.json only, and for the default runtime maps the weights as the engine would."""
    from agent.runtime.checkpoint import ModelLoadError, read_config, resolve_model_path

    path = resolve_model_path(model, Path(models_dir) if models_dir else None)
    if path is None:
        raise ValueError(f"no model directory {model!r}; give one with -m DIR (or -m default)")
    try:
        config, _ = read_config(path)
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from None
    if runtime is not None and runtime not in RUNTIMES:
        raise ValueError(f"--runtime takes torch or engine, got {runtime!r}")
    if config.mixer != "window":
        raise ValueError(f"{model} has the {config.mixer} mixer; this bench measures the window mixer's memory: "
                         "give a window model with -m (the default model is one)")
    if "recall" in policies and not config.gla_branch:
        raise ValueError(f"{model} has no GLA branch, and the recall policy scores tokens by its recall error: "
                         "use --policy attention,novelty")
    vs = variants(slots, policies)
    configs = {}
    for v in vs:
        try:
            configs[v] = with_memory(config, v.slots, v.policy)
        except ValueError as exc:
            raise ValueError(f"variant {v.name}: {exc}") from None
    full = config.sinks + config.window + max(slots)  # tokens read when the largest memory is full
    if context is None:
        context = full + QUICK_PAST_FULL if quick else 2048
    if context < full:
        raise ValueError(f"--context {context} leaves the memory part empty: the largest (M = {max(slots)}) fills "
                         f"after S + W + M = {full} tokens; give --context {full} or more")
    sizes = Sizes(context, 64, 8, 1) if quick else Sizes(context, 512, 128, ROUNDS)
    return Plan(path, vs, sizes, *choose_runtime(path, configs, runtime))


def choose_runtime(path: Path, configs: dict[Variant, Any], runtime: str | None) -> tuple[str, str]:
    """(the runtime, why it): `runtime` when given (a ValueError for a variant the engine
    refuses); None: the engine where chat would run every variant on it (`cli/chat.py`
    engine_for: the card's dtype int8 or float32, then the engine loads), else torch."""
    from agent.runtime.modeldir import ModelLoadError, card_run_dtype
    from agent.runtime.native.engine import Engine, EngineUnavailable

    if runtime == "torch":
        return "torch", "--runtime torch"
    why = Engine.unsupported(configs[WINDOW])  # the model itself, memory or not
    refused = list(dict.fromkeys(v.policy for v, c in configs.items() if v != WINDOW and Engine.unsupported(c)))
    if runtime == "engine":
        if why:
            raise ValueError(f"--runtime engine: {why}; --runtime torch runs it")
        if refused:
            raise ValueError(f"--runtime engine: the torch-free engine keeps a memory by the novelty policy only, not "
                             f"{', '.join(refused)}; --runtime torch runs {'them' if len(refused) > 1 else 'it'} "
                             "(or measure the engine with --policy novelty)")
        return "engine", "--runtime engine"
    try:
        dtype = card_run_dtype(str(path))
    except ModelLoadError as exc:
        raise ValueError(str(exc)) from None
    weights = {"int8": "int8", "float32": "fp32"}.get(dtype)
    if weights is None:
        return "torch", f"default: chat runs the card's dtype {dtype} on torch"
    if why or refused:
        return "torch", f"default: {why or 'the engine runs the novelty memory only, not ' + ', '.join(refused)}"
    try:
        Engine.load(path, weights=weights, threads=1, config=configs[WINDOW])  # maps the files, as chat's start does
    except EngineUnavailable as exc:
        return "torch", f"default: {exc}"
    return "engine", f"default: chat runs this model on the torch-free engine ({weights})"


def child_command(p: Plan, v: Variant, threads: int) -> list[str]:
    s = p.sizes
    policy = ["--policy", v.policy] if v.policy else []
    return [sys.executable, "-m", "agent.bench.window_memory_child", str(p.model_dir), "--slots", str(v.slots), *policy,
            "--runtime", p.runtime, "--context", str(s.context), "--prefill", str(s.prefill), "--decode", str(s.decode),
            "--rounds", "1", "--threads", str(threads)]  # the rounds are the parent's: interleaved


def run_variant(p: Plan, v: Variant, threads: int) -> dict[str, Any]:
    """One child's result, its peak RSS (the polled VmHWM or its own, the larger) and the
    share of the CPU other processes took meanwhile."""
    run = run_child(child_command(p, v, threads), env=child_env(threads), timeout=CHILD_TIMEOUT_S, what=f"variant {v.name}")
    try:
        res = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise MeasureError(f"variant {v.name} printed no result: {run.stdout.strip()[-200:]!r}") from None
    return {**res, "peak_rss_MB": max(run.peak_kb, int(res["peak_kb"])) / 1024, "others_cpu_share": run.others_cpu_share}


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's children (one round each) as one result: the rounds' seconds in order,
    tok/s from their medians, the largest peak RSS and others' CPU share."""
    first = rounds[0]
    decode_s = [x for r in rounds for x in r["decode_s"]]
    prefill_s = [x for r in rounds for x in r["prefill_s"]]
    return {**first, "decode_s": decode_s, "prefill_s": prefill_s,
            "decode_tok_s": first["decode_tok_s"] * first["decode_s"][0] / statistics.median(decode_s),
            "prefill_tok_s": first["prefill_tok_s"] * first["prefill_s"][0] / statistics.median(prefill_s),
            "peak_rss_MB": max(r["peak_rss_MB"] for r in rounds),
            "others_cpu_share": max(r["others_cpu_share"] for r in rounds)}


def paired_ratio(r: dict[str, Any], base: dict[str, Any], key: str, tok_s: str) -> float:
    """Time per token, variant / window: the median over rounds of the ratio within each round
    (`key`: "decode_s" or "prefill_s", one entry per round, the same work in both); without
    per-round times, the ratio of the tok/s."""
    a, b = r.get(key), base.get(key)
    if a and b and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b))
    return base[tok_s] / r[tok_s]


def judge(runs: dict[str, dict[str, Any]], valid: bool) -> dict[str, dict[str, Any]]:
    """Each variant's ratios to `window` (time per token, variant / window, `paired_ratio`)
    and the floors: the state's always, decode's only on a valid run (None otherwise)."""
    base = runs[WINDOW.name]
    out = {}
    for name, r in runs.items():
        decode = paired_ratio(r, base, "decode_s", "decode_tok_s")
        prefill = paired_ratio(r, base, "prefill_s", "prefill_tok_s")
        state_ok = r["state_bytes"] <= FLOOR_STATE_MB * MB
        decode_ok = decode <= FLOOR_DECODE_TIME if valid else None
        out[name] = {"decode_time_ratio": round(decode, 3), "prefill_time_ratio": round(prefill, 3),
                     "floors": {"decode_time": decode_ok, "state": state_ok},
                     "floors_met": (decode_ok and state_ok) if valid else None}
    return out


def note(j: dict[str, Any], valid: bool) -> str:
    over = [] if j["floors"]["state"] else [f"state over {FLOOR_STATE_MB} MB"]
    if not valid:
        return "; ".join(["NOT VALID: measured under load", *over])
    if not j["floors"]["decode_time"]:
        over.insert(0, f"decode over {FLOOR_DECODE_TIME}x")
    return "below floor: " + ", ".join(over) if over else "floors met"


def row(name: str, r: dict[str, Any], j: dict[str, Any], valid: bool) -> dict[str, Any]:
    filled = r["memory_filled"]
    return {"variant": name, "prefill_tok_s": round(r["prefill_tok_s"], 1), "decode_tok_s": round(r["decode_tok_s"], 2),
            "prefill_time_x": j["prefill_time_ratio"], "decode_time_x": j["decode_time_ratio"],
            "state_MB": round(r["state_bytes"] / MB, 2), "memory_MB": round(r["memory_bytes"] / MB, 2),
            "memory_filled": "-" if filled is None else f"{filled:.0%}", "peak_rss_MB": round(r["peak_rss_MB"]),
            "note": note(j, valid)}


def report(p: Plan, model: str, runs: dict[str, dict[str, Any]], verdict: dict[str, Any], quick: bool) -> dict[str, Any]:
    from rich.markup import escape  # bench's report prints summaries as markup

    valid = bool(verdict["valid"])
    judged = judge(runs, valid)
    memory = [n for n in runs if n != WINDOW.name]
    s = p.sizes
    base = runs[WINDOW.name]
    if valid:
        met = [n for n in memory if judged[n]["floors_met"]]
        floors = f"met by {', '.join(met)}" if met else "met by none"
    else:
        floors = "not judged: measured under load"
    summary = {
        "model": f"{model} ({base['weights']}, {base['threads']} threads)",
        "runtime": f"{p.runtime} ({p.runtime_why})",
        "sizes": (f"{s.context} tokens read, then prefill {s.prefill} and decode {s.decode}, "
                  + ("1 round (--quick: not a measurement)" if quick
                     else f"{s.rounds} interleaved rounds, each variant once per round; ratios: the median of the rounds' ratios")),
        "ratios": "variant / window of the time per token: above 1 is slower than the window alone",
        "floor": f"decode time ratio <= {FLOOR_DECODE_TIME}, state <= {FLOOR_STATE_MB} MB (issue 37)",
        "floors": floors,
        "load": load_line(verdict),
        "ratios_valid": "yes" if valid else "NO",
    }
    variants_out = {n: {**runs[n], **judged[n]} for n in runs}
    return {"rows": [row(n, runs[n], judged[n], valid) for n in runs], "variants": variants_out,
            "sizes": dataclasses.asdict(s), "model": model, "model_dir": str(p.model_dir), "runtime": p.runtime,
            "runtime_why": p.runtime_why, "ratios_valid": valid,
            "load": dict(verdict), "floor": {"decode_time_ratio": FLOOR_DECODE_TIME, "state_MB": FLOOR_STATE_MB},
            "summary": {k: escape(v) for k, v in summary.items()}}


def bench_window_memory(quick: bool, *, model: str = "default", models_dir: str | Path | None = None,
                        slots: Sequence[int] = DEFAULT_SLOTS, policies: Sequence[str] = POLICIES,
                        context: int | None = None, runtime: str | None = None, threads: int = 2, max_load: float = MAX_LOAD,
                        max_others: float = MAX_OTHERS, settle_s: float = 60.0, log: Log = _stderr) -> dict[str, Any]:
    """The whole comparison; a ValueError for a bad choice (`plan`), a MeasureError when a
    child fails."""
    p = plan(model, models_dir, slots, policies, quick=quick, context=context, runtime=runtime)
    log(f"runtime: {p.runtime} ({p.runtime_why})")
    load_before = settle(max_load, 0.0 if quick else settle_s, log)
    each: dict[str, list[dict[str, Any]]] = {v.name: [] for v in p.variants}
    for i in range(p.sizes.rounds):
        for v in p.variants if i % 2 == 0 else p.variants[::-1]:
            r = run_variant(p, v, threads)
            each[v.name].append(r)
            log(f"round {i + 1}/{p.sizes.rounds} {v.name}: prefill {r['prefill_tok_s']:.1f} tok/s, decode "
                f"{r['decode_tok_s']:.2f} tok/s, state {r['state_bytes'] / MB:.2f} MB, peak RSS {r['peak_rss_MB']:.0f} MB")
    runs = {name: merge_rounds(rs) for name, rs in each.items()}
    verdict = load_verdict(load_before, os.getloadavg()[0], [r["others_cpu_share"] for r in runs.values()],
                           max_load=max_load, max_others=max_others)
    return report(p, model, runs, verdict, quick)
