"""The `laplace` command line: the only place that builds concrete objects and wires them.

Commands parse arguments and call services; heavy imports (torch) happen inside the
commands that need them, so `laplace sessions list` stays fast.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

# Before anything loads numpy (the session store does): OpenBLAS reads this once, and the
# torch-free engine's fp32 prefill needs its idle threads to stop spinning (native/engine.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import typer  # noqa: E402

from agent.cli.errors import fail  # noqa: E402
from agent.cli.store import settings_of  # noqa: E402
from agent.display import human_bytes, json_for_terminal  # noqa: E402
from agent.settings import Settings, SettingsError  # noqa: E402

app = typer.Typer(
    name="laplace",
    help="A terminal chat agent for indefinitely long sessions on fixed-state GLA models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """laplace: chat with a model whose memory of the session never grows."""
    # The environment is read here, once, and passed down: every command takes it from ctx.
    try:
        ctx.obj = Settings.from_env()
    except SettingsError as exc:
        raise fail(str(exc)) from None
    if ctx.obj.timings:
        from agent import timings

        timings.enable(imported_at=_IMPORTED_AT)
        ctx.call_on_close(timings.finish)  # after the command, whichever way it ends


@app.command()
def info(
    ctx: typer.Context,
    model: str = typer.Option("default", "-m", "--model", help="Preset name, model name or model directory."),
    device: str = typer.Option("cpu", "--device", help="auto | cpu | cuda | neuron"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Model config, parameter count, state bytes per session, the KV cache it replaces, device."""
    from agent.runtime.info import ModelInfoError, describe_model

    from agent.cli.models import ensure_model

    settings = settings_of(ctx)
    ensure_model(settings, model)
    try:
        data = describe_model(model, device=device, models_dir=settings.models_dir)
    except ModelInfoError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json_for_terminal(data))
        return
    c = data["config"]
    if c.get("mixer") == "window":  # a converted Llama: the window's ring and the GLA branch make the state
        parts = data["state_parts"]
        branch = f"GLA branch ({c['combine']})" if c["gla_branch"] else "no GLA branch"
        from agent.importers.shipped import describe_memory  # torch-free

        said = describe_memory(c.get("memory_slots", 0), c.get("memory_policy", "recall"), c.get("memory_layers") or (), c["n_layers"],
                               c.get("memory_rest_slots", 0), c.get("memory_distance", 0), c.get("memory_rest_distance", 0))
        memory = f", memory of evicted tokens per kv head: {said}" if c.get("memory_slots") else ""
        shape = (f"{c['n_heads']} heads / {c['n_kv_heads']} kv heads of {c['head_k_dim']}, window {c['window']} + {c['sinks']} sinks, "
                 f"{branch}{memory}, GLU {c['ffn_dim']}, vocab {c['vocab_size']}")
        from agent.runtime.state_spec import MEMORY_TENSORS  # torch-free

        held = sum(parts.get(n, 0) for n in MEMORY_TENSORS)
        split = (f"window {parts['win_k'] + parts['win_v']:,} + GLA {parts.get('gla', 0):,}"
                 + (f" + memory {held:,}" if held else "") + f" + positions {parts['pos']:,}; ")
    else:
        shape = f"{c['n_heads']} heads of {c['head_k_dim']} x {c['head_v_dim']} state, GLU {c['ffn_dim']}, conv {c['conv_size']}, vocab {c['vocab_size']}"
        split = ""
    lines = [
        f"model        {data['name']}  ({data['source']})",
        f"layers       {c['n_layers']} x hidden {c['d_model']}, {shape}",
        f"parameters   {data['parameters'] / 1e9:.3f} B  ({data['parameters']:,}; Muon {data['muon_parameters']:,}, AdamW {data['adamw_parameters']:,})",
        f"state        {data['state_bytes']:,} bytes per sequence ({human_bytes(data['state_bytes'])}; {split}fixed at any context length)",
        f"KV cache     {data['kv_cache_bytes_8k']:,} bytes for a comparable bf16 softmax model at 8,192 tokens ({human_bytes(data['kv_cache_bytes_8k'])}, {data['kv_cache_ratio_8k']:.1f}x the state)",
        f"half-lives   {', '.join(f'{h:.3g}' for h in data['half_lives'])} tokens at init" if data["half_lives"]
        else "half-lives   set by the input (a Mamba-2 mixer has no schedule); laplace probe measures them",
        f"device       {data['device']}",
    ]
    from agent.recall.horizon import horizon_from_card, window_horizon  # torch-free

    horizon = horizon_from_card(data.get("card") or {})
    if horizon is not None:
        lines.append(f"recall       refresh folds back turns that ended over {horizon:,} tokens ago (the model card's measured recall)")
    elif c.get("mixer") == "window":
        lines.append(f"recall       refresh folds back turns that ended over {window_horizon(c['window']):,} tokens ago (a quarter of the window)")
    if data.get("fingerprint"):
        lines.append(f"fingerprint  {data['fingerprint'][:16]}")
    card = dict(data.get("card") or {})
    if isinstance(card.get("shipped"), list) and all(isinstance(r, dict) for r in card["shipped"]):  # the default model's trained parameters (agent/importers/default_model.py)
        from agent.importers.default_model import describe_shipped

        shipped = card.pop("shipped")
        lines.append(f"shipped      {describe_shipped(shipped)}{' applied' if shipped else ''}")
    for key, value in card.items():
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = "; ".join(value)
        elif isinstance(value, (list, dict)):
            value = json.dumps(value) if value else "none"
        lines.append(f"card.{key:<8} {value}")
    typer.echo("\n".join(lines))


@app.command()
def bench(
    ctx: typer.Context,
    names: Optional[list[str]] = typer.Argument(None, help="Benchmarks to run (default: all). See --list."),
    quick: bool = typer.Option(False, "--quick", help="Smaller sizes, for a fast look."),
    out: str = typer.Option("laplace-bench.json", "--out", "-o", help="Where to write the JSON results."),
    list_: bool = typer.Option(False, "--list", help="List the benchmarks and exit."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="For cpu1b: a model to measure instead of the random 1B shape; for dtype: the model whose dtypes to compare (default demo); for window-memory: a window model (default: default); for serve: the model to serve (default tiny); for llamacpp: default (the only model with its GGUF at hand)."),
    shape: Optional[str] = typer.Option(None, "--shape", help="For llamacpp: the Mamba-2 rows' shape, mamba2-130m (default) | tiny, then key=value overrides."),
    report_dir: str = typer.Option("laplace-serve-report", "--report-dir", help="serve: where report.md, report.json and the PNGs go."),
    rates: Optional[str] = typer.Option(None, "--rates", help="serve: Poisson arrival rates in requests/s, e.g. 2,4,8."),
    duration: Optional[float] = typer.Option(None, "--duration", help="serve: seconds of arrivals per rate."),
    compile_backend: Optional[str] = typer.Option(None, "--compile-backend", help="serve: eager (Dynamo capture, fast), inductor, or none."),
    users: Optional[str] = typer.Option(None, "--users", help="serve: closed-loop phases, users sending back to back, e.g. 1,4,16."),
    memory_slots: Optional[str] = typer.Option(None, "--memory-slots", help="window-memory: memory sizes M, e.g. 64,128 (default)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="window-memory: memory policies, one or more of recall, attention, novelty (default all three)."),
    context: Optional[int] = typer.Option(None, "--context", help="window-memory: tokens read before the timed prefill and decode (default 2048)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="window-memory: torch or engine (the torch-free engine: novelty memory only); default: the engine when chat would run every variant on it, else torch."),
) -> None:
    """Benchmarks that back our performance claims, each against a baseline in the same run."""
    from pathlib import Path

    from rich.console import Console

    from agent.bench import registry
    from agent.bench.report import run_benches

    benches = registry()
    if list_:
        typer.echo("\n".join(benches))
        return
    chosen = names or list(benches)
    unknown = [n for n in chosen if n not in benches]
    if unknown:
        raise fail(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(benches)}")
    serve_flags = rates is not None or duration is not None or compile_backend is not None or users is not None
    memory_flags = memory_slots is not None or policy is not None or context is not None or runtime is not None
    if memory_flags and "window-memory" not in chosen:
        raise fail("--memory-slots, --policy, --context and --runtime apply to the window-memory benchmark only: "
                   "laplace bench window-memory -m MODEL --memory-slots 64,128")
    window_memory = _window_memory_choices(memory_slots, policy) if "window-memory" in chosen else None
    if (model is not None or serve_flags) and chosen == ["serve"]:
        benches["serve"] = _serve_pilot(settings_of(ctx), model=model, report_dir=report_dir, rates=rates,
                                        duration=duration, compile_backend=compile_backend, users=users)
    elif serve_flags:
        raise fail("--rates, --duration, --users and --compile-backend apply to the serve benchmark only: "
                   "laplace bench serve ...")
    elif model is not None and chosen == ["window-memory"]:
        pass  # measured below, once the model is built
    elif model is not None and chosen == ["llamacpp"]:
        if model != "default":
            raise fail(f"llamacpp compares the default model with the GGUF it is built from; -m {model} has no such GGUF: "
                       "laplace bench llamacpp -m default")
    elif model is not None:
        if chosen not in (["cpu1b"], ["dtype"]):
            raise fail("-m applies to the cpu1b, dtype, window-memory, serve and llamacpp benchmarks only: "
                       "laplace bench dtype -m MODEL")
        from functools import partial

        from agent.bench.cpu1b import bench_cpu1b
        from agent.bench.dtype import bench_dtype

        fn = bench_cpu1b if chosen == ["cpu1b"] else bench_dtype
        benches[chosen[0]] = partial(fn, model=model, models_dir=str(settings_of(ctx).models_dir))
    elif chosen == ["serve"]:
        benches["serve"] = _serve_pilot(settings_of(ctx), model=None, report_dir=report_dir, rates=None, duration=None,
                                        compile_backend=None, users=None)
    if shape is not None and chosen != ["llamacpp"]:
        raise fail("--shape applies to the llamacpp benchmark only: laplace bench llamacpp --shape SHAPE")
    if "llamacpp" in chosen:
        benches["llamacpp"] = _llamacpp(settings_of(ctx), shape)
    if "finetune-memory" in chosen:  # it trains the user's default model: settings are read here, at the edge
        from functools import partial

        from agent.bench.memory import bench_finetune_memory

        benches["finetune-memory"] = partial(bench_finetune_memory, models_dir=str(settings_of(ctx).models_dir))
    if model is not None or "llamacpp" in chosen or window_memory:  # the flags are checked: now build the default if it is needed
        from agent.cli.models import ensure_model

        ensure_model(settings_of(ctx), model or "default")
    if window_memory:
        benches["window-memory"] = _window_memory(settings_of(ctx), model or "default", *window_memory, context, runtime,
                                                  quick)
    from agent.bench.llamacpp import BENCH_ERRORS, EXIT_UNDER_LOAD, under_load

    try:
        doc = run_benches(chosen, benches, quick=quick, out=Path(out), console=Console(width=200))
    except BENCH_ERRORS as exc:
        raise fail(str(exc)) from None
    busy = under_load(doc)
    if busy:
        raise fail(f"{', '.join(busy)}: the machine was busy, so no ratio is valid (numbers written to {out}); run it "
                   "again with nothing else running", code=EXIT_UNDER_LOAD)


def _window_memory_choices(memory_slots: Optional[str], policy: Optional[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """--memory-slots and --policy, checked before any model is built."""
    from agent.bench.window_memory import parse_policies, parse_slots

    try:
        return parse_slots(memory_slots), parse_policies(policy)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _window_memory(settings: Settings, model: str, slots: tuple[int, ...], policies: tuple[str, ...],
                   context: Optional[int], runtime: Optional[str], quick: bool):  # type: ignore[no-untyped-def]
    """`laplace bench window-memory` on `model`; a model or choice it cannot measure fails here, before any child."""
    from functools import partial

    from agent.bench.window_memory import bench_window_memory, plan

    try:
        plan(model, settings.models_dir, slots, policies, quick=quick, context=context, runtime=runtime)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return partial(bench_window_memory, model=model, models_dir=settings.models_dir, slots=slots, policies=policies,
                   context=context, runtime=runtime)


def _llamacpp(settings: Settings, shape: Optional[str]):  # type: ignore[no-untyped-def]
    """`laplace bench llamacpp` on this CLI's Settings; a bad --shape or LAPLACE_DTYPE fails before any work."""
    from agent.bench.llamacpp import bench_for_settings, laplace_dtype
    from agent.bench.llamacpp_mamba import parse_shape

    try:
        if shape is not None:
            parse_shape(shape)
        laplace_dtype(settings.dtype)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return lambda quick: bench_for_settings(settings, quick, mamba_shape=shape)


def _serve_pilot(settings: Settings, *, model: Optional[str], report_dir: str, rates: Optional[str],
                 duration: Optional[float], compile_backend: Optional[str], users: Optional[str]):  # type: ignore[no-untyped-def]
    """`laplace bench serve` with its own flags; --quick still picks the short defaults."""
    from pathlib import Path

    from agent.bench.serve import PilotConfig, run_pilot

    changes: dict[str, object] = {"dtype": settings.dtype}  # LAPLACE_DTYPE: the server's and the replay's
    if model is not None:
        changes["model"] = model
    if rates is not None:
        try:
            changes["rates"] = tuple(float(r) for r in rates.split(",") if r.strip())
        except ValueError:
            raise fail(f"--rates takes requests per second like 2,4,8, got {rates!r}") from None
        if not changes["rates"] or min(changes["rates"]) <= 0:  # type: ignore[arg-type]
            raise fail(f"--rates takes positive requests per second like 2,4,8, got {rates!r}")
    if users is not None:
        try:
            counts = tuple(sorted({int(u) for u in users.split(",") if u.strip()}))
        except ValueError:
            raise fail(f"--users takes user counts like 1,4,16, got {users!r}") from None
        if not counts or counts[0] < 1:
            raise fail(f"--users takes positive user counts like 1,4,16, got {users!r}")
        changes["users"] = counts
    if duration is not None:
        if not 0 < duration <= 600:
            raise fail("--duration is seconds per rate, between 0 and 600")
        changes["duration_s"] = duration
    if compile_backend is not None:
        if compile_backend not in ("eager", "inductor", "none"):
            raise fail(f"--compile-backend is eager, inductor or none, got {compile_backend!r}")
        changes["compile_backend"] = compile_backend

    def pilot(quick: bool) -> dict:
        cfg = PilotConfig.quick(**changes) if quick else PilotConfig(**changes)  # type: ignore[arg-type]
        return run_pilot(cfg, Path(report_dir), models_dir=settings.models_dir)

    return pilot


def _register_subcommands() -> None:
    from agent.cli import chat as cli_chat, finetune as cli_finetune, models as cli_models, probe as cli_probe, sessions as cli_sessions
    from agent.cli import serve as cli_serve

    cli_chat.register(app)
    cli_serve.register(app)
    app.add_typer(cli_sessions.app, name="sessions", help="Manage saved sessions.")
    app.add_typer(cli_probe.app, name="probe", help="Measure what a fixed state still remembers.")
    app.command("finetune")(cli_finetune.finetune_command)
    app.command("pull")(cli_models.pull_command)
    app.command("import")(cli_models.import_command)


_register_subcommands()
_IMPORTED_AT = time.perf_counter()  # LAPLACE_TIMINGS splits the start-up here: imports, then parsing


def main() -> None:
    """The console entry point: argv goes to the commands as given (see `OptionPairsCommand`)."""
    app(prog_name="laplace")
