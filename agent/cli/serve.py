"""`laplace serve`: the OpenAI-compatible server over the session store, wired from flags.

Builds the model and runner (eager, or compiled over fixed widths with every compile
logged), the turn writer over the same store `laplace chat` uses, the scheduler and the
app; binds loopback unless told otherwise, and then only with a bearer token.
"""

from __future__ import annotations

from typing import Optional

import typer

from agent.cli.chat import DEVICE_OPT, OptionPairsCommand, SAMPLING_OPT, load_model_as, parse_option_pairs
from agent.cli.errors import fail
from agent.cli.store import open_store, settings_of


def parse_widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(sorted({int(w) for w in text.split(",") if w.strip()}))
    except ValueError:
        raise fail(f"--widths takes comma-separated batch widths like 1,2,4,8,16, got {text!r}") from None
    if not widths or widths[0] < 1:
        raise fail(f"--widths takes positive batch widths like 1,2,4,8,16, got {text!r}")
    if len(widths) > 8:
        raise fail(f"--widths has {len(widths)} widths; a compiled function keeps at most 8 shapes (Dynamo's cache limit)")
    return widths


def serve_command(
    ctx: typer.Context,
    model: str = typer.Option("default", "-m", "--model", help="Model name or directory."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback requires the bearer token."),
    port: int = typer.Option(8080, "--port", help="Port (0: any free port, printed at start)."),
    widths: str = typer.Option("1,2,4,8,16", "--widths", help="Decode batch widths; each step is padded up to the next."),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile the decode and prefill shapes, all at start-up."),
    compile_backend: str = typer.Option("inductor", "--compile-backend", help="With --compile: inductor, or eager (Dynamo capture only, fast to start)."),
    device: str = DEVICE_OPT,
    option: Optional[list[str]] = SAMPLING_OPT,
    require_token: bool = typer.Option(False, "--require-token", help="Ask for the bearer token on loopback too."),
    max_body: int = typer.Option(1 << 20, "--max-body", help="Largest request body in bytes (413 above)."),
    max_tokens: int = typer.Option(4096, "--max-tokens", help="Largest max_tokens a request may ask for (400 above)."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests that may wait for a batch row (429 with Retry-After above)."),
    max_prompt_tokens: int = typer.Option(8192, "--max-prompt-tokens", help="Most prompt tokens one request may make the model read (400 above)."),
    allow_origin: Optional[list[str]] = typer.Option(None, "--allow-origin", help="A browser origin allowed to call the server, e.g. http://localhost:3000 (repeat; * for any). Others are refused."),
    allow_host: Optional[list[str]] = typer.Option(None, "--allow-host", help="A Host name the server answers to besides localhost and its address (repeat)."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level (info shows each request)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for the model (default: every core but one, which the HTTP side needs)."),
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API; sessions continue from their saved state."""
    from agent.cli.chat import make_runner
    from agent.serve.protocol import Limits
    from agent.serve.server import TOKEN_FILE, bind, is_loopback, load_or_create_token

    from agent.chat.options import parse_pairs

    settings = settings_of(ctx)
    width_set = parse_widths(widths)
    try:
        given = parse_pairs(parse_option_pairs(option))
    except ValueError as exc:
        raise fail(str(exc)) from None
    if min(max_body, max_tokens, max_prompt_tokens) < 1 or max_queue < 0:
        raise fail("--max-body, --max-tokens and --max-prompt-tokens must be at least 1, --max-queue at least 0")
    origins = frozenset(o.strip().rstrip("/").lower() for o in allow_origin or [])
    bad = [o for o in origins if o != "*" and not o.startswith(("http://", "https://"))]
    if bad:
        raise fail(f"--allow-origin takes an origin like http://localhost:3000 (or *), got {bad[0]!r}")
    token = None
    if require_token or not is_loopback(host):
        token, created = load_or_create_token(settings.home / TOKEN_FILE)
        where = settings.home / TOKEN_FILE
        typer.echo(f"bearer token {'created in' if created else 'read from'} {where} (mode 0600); clients send "
                   "Authorization: Bearer $(cat " + str(where) + ")", err=True)
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port or --host") from None

    from agent.chat.turns import TurnWriter
    from agent.serve.app import ServerInfo, create_app
    from agent.serve.scheduler import Scheduler

    if threads is not None and threads < 1:
        raise fail("--threads must be at least 1")
    lm, model_id, dev = load_model_as(settings, model, device)
    if dev.type == "cpu":
        import os

        import torch

        # The model's intra-op threads spin on every core they get; leaving none for the event
        # loop that streams the replies made a loaded 2-core machine ~5x slower (measured).
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) - 1))
    log = None
    if compile_ or dev.type == "neuron":
        from agent.serve.compiling import compiled_runner

        backend = "neuron" if dev.type == "neuron" else compile_backend
        runner, log = compiled_runner(lm.model, widths=width_set, backend=backend)
        typer.echo(f"compiling {len(width_set)} decode widths and {len(runner.segment_buckets)} prefill buckets "
                   f"with {backend} ...", err=True)
        timings = runner.warm_up()
        log.warm = True
        typer.echo(f"compiled in {sum(timings.values()):.1f} s; no shape is compiled after this", err=True)
    else:
        runner = make_runner(lm.model, dev, settings)
    store = open_store(settings)
    writer = TurnWriter(store, lm, runner, model_id=model_id)
    scheduler = Scheduler(writer, widths=width_set, options=given,
                          limits=Limits(max_body_bytes=max_body, max_tokens=max_tokens, max_queue=max_queue,
                                        max_prompt_tokens=max_prompt_tokens))
    info = ServerInfo(model_id=model_id, token=token, bound=host, allow_origins=origins,
                      allow_hosts=frozenset(h.strip().lower() for h in allow_host or []),
                      model={"state_bytes": lm.config.state_bytes(), "fingerprint": writer.fingerprint,
                             "widths": list(width_set), "compiled": log is not None, "device": str(dev)},
                      stats=(lambda: {"compile": {**log.summary(), "warmup_seconds": timings}}) if log is not None else None)
    from agent.serve.server import serve, shut_down

    try:
        serve(create_app(scheduler, info), sock, log_level=log_level,
              announce=lambda url: typer.echo(f"laplace serve: {model_id} on {url}/v1 (OpenAI-compatible)", err=True))
    finally:
        if not shut_down(scheduler, store):
            typer.echo("warning: the scheduler did not stop within 30 s; the session store is left open under it "
                       "(the next start takes its leases over and marks its replies cancelled)", err=True)


def register(app: typer.Typer) -> None:
    app.command("serve", cls=OptionPairsCommand)(serve_command)
