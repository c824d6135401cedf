"""The `laplace` command line: the only place that builds concrete objects and wires them.

Commands parse arguments and call services; heavy imports (torch) happen inside the
commands that need them, so `laplace sessions list` stays fast.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from agent.cli.errors import fail
from agent.units import human_bytes
from agent.settings import Settings

app = typer.Typer(
    name="laplace",
    help="A terminal chat agent for indefinitely long sessions on fixed-state GLA models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """laplace: chat with a model whose memory of the session never grows."""




@app.command()
def info(
    model: str = typer.Option("default", "-m", "--model", help="Preset name, model name or model directory."),
    device: str = typer.Option("cpu", "--device", help="auto | cpu | cuda | neuron"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Model config, parameter count, state bytes per session, the KV cache it replaces, device."""
    from agent.runtime.info import ModelInfoError, describe_model

    settings = Settings.from_env()
    try:
        data = describe_model(model, device=device, models_dir=settings.models_dir)
    except ModelInfoError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    c = data["config"]
    lines = [
        f"model        {data['name']}  ({data['source']})",
        f"layers       {c['n_layers']} x hidden {c['d_model']}, {c['n_heads']} heads of {c['head_k_dim']} x {c['head_v_dim']} state, GLU {c['ffn_dim']}, conv {c['conv_size']}, vocab {c['vocab_size']}",
        f"parameters   {data['parameters'] / 1e9:.3f} B  ({data['parameters']:,}; Muon {data['muon_parameters']:,}, AdamW {data['adamw_parameters']:,})",
        f"state        {data['state_bytes']:,} bytes per sequence ({human_bytes(data['state_bytes'])}), at any context length",
        f"KV cache     {data['kv_cache_bytes_8k']:,} bytes for a comparable bf16 softmax model at 8,192 tokens ({human_bytes(data['kv_cache_bytes_8k'])}, {data['kv_cache_ratio_8k']:.1f}x the state)",
        f"half-lives   {', '.join(f'{h:.3g}' for h in data['half_lives'])} tokens at init" if data["half_lives"]
        else "half-lives   set by the input (a Mamba-2 mixer has no schedule); laplace probe measures them",
        f"device       {data['device']}",
    ]
    if data.get("fingerprint"):
        lines.append(f"fingerprint  {data['fingerprint'][:16]}")
    for key, value in (data.get("card") or {}).items():
        lines.append(f"card.{key:<8} {value}")
    typer.echo("\n".join(lines))


@app.command()
def bench(
    names: Optional[list[str]] = typer.Argument(None, help="Benchmarks to run (default: all). See --list."),
    quick: bool = typer.Option(False, "--quick", help="Smaller sizes, for a fast look."),
    out: str = typer.Option("laplace-bench.json", "--out", "-o", help="Where to write the JSON results."),
    list_: bool = typer.Option(False, "--list", help="List the benchmarks and exit."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="For cpu1b: a model to measure instead of the random 1B shape."),
    shape: Optional[str] = typer.Option(None, "--shape", help="For llamacpp: mamba2-130m (default) | tiny, then key=value overrides."),
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
    if model is not None:
        if chosen != ["cpu1b"]:
            raise fail("-m applies to the cpu1b benchmark only: laplace bench cpu1b -m MODEL")
        from functools import partial

        from agent.bench.cpu1b import bench_cpu1b

        benches["cpu1b"] = partial(bench_cpu1b, model=model, models_dir=str(Settings.from_env().models_dir))
    if shape is not None:
        if chosen != ["llamacpp"]:
            raise fail("--shape applies to the llamacpp benchmark only: laplace bench llamacpp --shape SHAPE")
        from agent.bench.llamacpp import bench_llamacpp, parse_shape

        try:
            parse_shape(shape)
        except ValueError as exc:
            raise fail(str(exc)) from None
        benches["llamacpp"] = lambda q: bench_llamacpp(q, shape=shape)
    run_benches(chosen, benches, quick=quick, out=Path(out), console=Console(width=200))


def _register_subcommands() -> None:
    from agent.cli import chat as cli_chat, finetune as cli_finetune, models as cli_models, probe as cli_probe, sessions as cli_sessions

    cli_chat.register(app)
    app.add_typer(cli_sessions.app, name="sessions", help="Manage saved sessions.")
    app.add_typer(cli_probe.app, name="probe", help="Measure what a fixed state still remembers.")
    app.command("finetune")(cli_finetune.finetune_command)
    app.command("pull")(cli_models.pull_command)
    app.command("import")(cli_models.import_command)


_register_subcommands()


def main() -> None:  # pragma: no cover - console entry point
    import sys

    from agent.cli.chat import join_option_pairs

    app(args=join_option_pairs(sys.argv[1:]), prog_name="laplace")
