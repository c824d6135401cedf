"""`laplace probe ...`: recall suites on a model, and read-only recall checks on a session.

The lead mounts this Typer app as `laplace probe`. Commands parse arguments, build the
objects and call `agent.probes`; torch and the probe code are imported inside commands.
Bad input (missing model, unknown suite, unreadable filler file, bad --expect, unknown
session) is one `error: ...` line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import typer

from agent.cli.errors import fail as _fail
from agent.cli.store import settings_of
from agent.settings import Settings

app = typer.Typer(help="Measure what a fixed state still remembers.", no_args_is_help=True, pretty_exceptions_enable=False)
MODEL_OPT = typer.Option("default", "-m", "--model", help="Model name, model directory or 'tiny'.")
DEVICE_OPT = typer.Option(None, "--device", help="auto | cpu | cuda | neuron (default: LAPLACE_DEVICE or auto)")
THREADS_OPT = typer.Option(0, "--threads", help="torch CPU threads (0: torch's default; 1 is fastest for tiny models).")




def _process_start() -> float:
    """When this process started, on `time.perf_counter`'s clock (Linux: from /proc, so
    the interpreter's start-up and imports count too); elsewhere, now."""
    now = time.perf_counter()
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now


def _load(model: str, device: str, settings: Settings):  # type: ignore[no-untyped-def]
    from agent.cli.models import ensure_model
    from agent.runtime.checkpoint import ModelLoadError, load_model
    from agent.runtime.device import DeviceUnavailableError, resolve_device

    ensure_model(settings, model)
    try:
        dev = resolve_device(device)
        return load_model(model, device=dev, models_dir=settings.models_dir), str(dev)
    except (ModelLoadError, DeviceUnavailableError) as exc:
        raise _fail(str(exc)) from None


def _refresh_mode(refresh: str) -> str:
    """`refresh`, checked against the probe's modes (no torch needed to refuse it)."""
    from agent.probes.suites import REFRESH_MODES

    if refresh not in REFRESH_MODES:
        raise _fail(f"unknown --refresh {refresh!r}; choose {', '.join(REFRESH_MODES[:-1])} or {REFRESH_MODES[-1]}")
    return refresh


def _threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


@app.command("run")
def run(
    ctx: typer.Context,
    model: str = MODEL_OPT,
    suite: str = typer.Option("quick", "--suite", help="smoke | quick | standard | full | refresh"),
    budget: Optional[float] = typer.Option(None, "--budget", help="Seconds; the suite shrinks to fit and lists what it skipped (default: quick 45, standard 600)."),
    no_budget: bool = typer.Option(False, "--no-budget", help="Run the suite's whole grid whatever it takes."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG plot here."),
    filler: list[str] = typer.Option([], "--filler", help="Override the suite's fillers (repeatable): noise, grammar, chat, logs, file:PATH."),
    style: str = typer.Option("auto", "--style", help="auto (chat when the model's tokenizer holds its chat template's tokens) | completion (base models) | chat (chat models)"),
    seed: int = typer.Option(0, "--seed", help="Seed mixed into every sample's hash."),
    device: Optional[str] = DEVICE_OPT,
    threads: int = THREADS_OPT,
    no_record: bool = typer.Option(False, "--no-record", help="Do not store the run in the database."),
    refresh: Optional[str] = typer.Option(None, "--refresh", help="Recall refresh: off | on | both (rows PROBE+refresh beside PROBE; default: the suite's, 'both' for --suite refresh)."),
    refresh_tokens: int = typer.Option(256, "--refresh-tokens", help="Most tokens a recall block may take."),
    refresh_horizon: int = typer.Option(0, "--refresh-horizon", help="Recall only turns older than this many tokens (0: the model's horizon)."),
) -> None:
    """Run a probe suite and print accuracy by distance, D50/H90 and the state metrics."""
    started = _process_start()  # a budget counts from here: starting up and loading the model are part of the wait
    from dataclasses import replace

    from agent.probes.fillers import FillerError, make_filler
    from agent.probes.report import build_report, dumps
    from agent.probes.runner import run_suite
    from agent.probes.suites import get_suite
    from agent.probes.table import render
    from agent.probes.tasks import STYLES, default_style

    settings = settings_of(ctx)
    try:
        chosen = get_suite(suite)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if style != "auto" and style not in STYLES:
        raise _fail(f"unknown prompt style {style!r}; choose auto, completion or chat")
    if budget is not None and budget <= 0:
        raise _fail("--budget must be a positive number of seconds")
    refresh = _refresh_mode(refresh or chosen.refresh)
    if refresh_tokens < 16 or refresh_horizon < 0:
        raise _fail("--refresh-tokens must be >= 16 and --refresh-horizon >= 0")
    if budget is None and not no_budget:
        budget = chosen.default_budget_s
    if no_budget:
        budget = None
    if filler:
        chosen = replace(chosen, fillers=tuple(dict.fromkeys(filler)))
    _threads(threads)
    loaded, dev = _load(model, device or settings.device, settings)
    if style == "auto":
        style = default_style(loaded.tokenizer, loaded.template)
        typer.echo(f"  prompt style {style} (from the model's chat template; --style overrides)", err=True)
    try:
        for f in chosen.fillers:  # a bad file: filler fails here, before any model work
            make_filler(f, loaded.tokenizer, loaded.template)
    except FillerError as exc:
        raise _fail(str(exc)) from None
    outcome = run_suite(loaded, chosen, budget_s=budget, seed=seed, style=style,
                        log=lambda m: typer.echo(f"  {m}", err=True), refresh=refresh,
                        refresh_tokens=refresh_tokens, refresh_horizon=refresh_horizon, started=started)
    elapsed = time.perf_counter() - started
    report = build_report(outcome, loaded, device=dev)
    typer.echo(render(report))
    typer.echo(f"time   {elapsed:.1f} s" + (f" (budget {budget:g} s)" if budget is not None else ""))
    try:
        if json_path is not None:
            json_path.write_text(dumps(report), encoding="utf-8")
            typer.echo(f"json   {json_path}")
        if plot is not None:
            from agent.probes.plot import plot_report

            plot_report(report, plot)
            typer.echo(f"plot   {plot}")
    except OSError as exc:
        raise _fail(f"cannot write output: {exc.strerror or exc}") from None
    if not no_record:
        _record(settings, report)


@app.command("natural")
def natural(
    ctx: typer.Context,
    model: str = MODEL_OPT,
    distances: str = typer.Option("0,256,512,1024,2048", "--distances", help="Comma-separated token distances, e.g. 0,256,512,2048."),
    trials: int = typer.Option(16, "--trials", help="Conversations per distance (spread over the concepts)."),
    refresh: str = typer.Option("both", "--refresh", help="Recall refresh: off | on | both (one row each per distance)."),
    seed: int = typer.Option(0, "--seed", help="Seed mixed into every conversation's hash."),
    device: Optional[str] = DEVICE_OPT,
    threads: int = THREADS_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of the table."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report JSON here."),
) -> None:
    """Recall of everyday details stated and asked in held-out natural phrasings, and how
    often a detail never given is answered "not told"; refresh off and on in one run."""
    from agent.probes.natural import render as render_natural
    from agent.probes.natural import run_natural
    from agent.display import displayable, json_for_terminal

    try:
        ds = [int(x) for x in distances.split(",") if x.strip()]
    except ValueError:
        raise _fail(f"bad --distances {distances!r}; give token counts like 0,256,512") from None
    if not ds or any(d < 0 for d in ds):
        raise _fail(f"bad --distances {distances!r}; give token counts >= 0 like 0,256,512")
    if trials < 1:
        raise _fail("--trials must be at least 1")
    _refresh_mode(refresh)
    if out is not None and not out.parent.is_dir():  # before the run, not after it
        raise _fail(f"cannot write {out}: no folder {out.parent}; create it or give another --out")
    settings = settings_of(ctx)
    _threads(threads)
    loaded, dev = _load(model, device or settings.device, settings)
    t0 = time.perf_counter()
    report = run_natural(loaded, distances=ds, trials=trials, refresh=refresh, seed=seed, device=dev)
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    # Replies are model output: shown, their control characters are made visible.
    typer.echo(json_for_terminal(report) if as_json else displayable(render_natural(report)) + f"\ntime   {report['elapsed_s']} s")
    if out is not None:
        try:
            out.write_text(json.dumps(report, indent=2), encoding="utf-8")
        except OSError as exc:
            raise _fail(f"cannot write {out}: {exc.strerror or exc}") from None
        typer.echo(f"json   {out}", err=True)


def _record(settings: Settings, report: dict[str, Any]) -> None:
    from sessions import SessionError, SessionStore

    try:
        settings.ensure_home()
        with SessionStore.open(settings.db_path) as store:
            run = store.browse.add_probe_run(model_id=report["model"]["name"], suite=report["suite"]["name"], payload=report)
        typer.echo(f"stored probe run {run.uid[:8]} in {settings.db_path}")
    except (SessionError, OSError) as exc:
        typer.echo(f"warning: probe run not stored in the database: {exc}", err=True)


@app.command("compare")
def compare(
    baseline: Path = typer.Argument(..., help="Baseline report JSON."),
    new: Path = typer.Argument(..., help="New report JSON."),
) -> None:
    """Exit 1 on a real regression: a cell beyond its interval, a D50 drop over 20%, a failed resume or self-test."""
    from agent.probes.report import ReportError, compare as compare_reports, load_report

    try:
        base, cur = load_report(baseline), load_report(new)
    except ReportError as exc:
        raise _fail(str(exc)) from None
    if base["model"]["config"] != cur["model"]["config"]:
        typer.echo("note: the two reports come from models of different shapes", err=True)
    regressions, compared = compare_reports(base, cur)
    for r in regressions:
        typer.echo(f"REGRESSION {r}")
    if regressions:
        typer.echo(f"{len(regressions)} regression(s) over {compared} shared cells")
        raise typer.Exit(1)
    typer.echo(f"no regression ({compared} shared cells compared)")


def _file_digest(db: Path) -> str:
    """sha256 over the database file and its WAL's frames (what holds committed data).

    SQLite's read-only open may create an empty -wal and a -shm (reader bookkeeping); an
    empty WAL holds nothing, so it hashes the same as an absent one."""
    h = hashlib.sha256()
    for p in (db, db.with_name(db.name + "-wal")):
        h.update(p.name.encode())
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()


@app.command("session")
def session(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., help="Session id (a unique prefix is enough)."),
    ask: str = typer.Option(..., "--ask", help="The question, e.g. 'What is my locker code?'"),
    expect: Optional[str] = typer.Option(None, "--expect", help="The answer it should remember; without it, print the model's answer."),
    turn: Optional[int] = typer.Option(None, "--turn", help="Check the state as of this turn id (default: the head)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model (default: the session's own)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda | neuron"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Ask a copy of a saved session's state; the database is opened read-only and left byte-identical."""
    if expect is not None and not expect.strip():
        raise _fail("--expect must not be empty")
    settings = settings_of(ctx)
    db = settings.db_path
    if not db.exists():
        raise _fail(f"no session database at {db}")
    from sessions import SessionError, SessionStore

    before = _file_digest(db)
    try:
        with SessionStore.open(db, readonly=True) as store:
            result = _check(store, settings, session_id, ask, expect, turn, model, device)
    except SessionError as exc:
        raise _fail(str(exc)) from None
    after = _file_digest(db)
    data = result.to_dict()
    data["database_unchanged"] = before == after
    if as_json:
        from agent.display import json_for_terminal

        typer.echo(json_for_terminal(json.loads(json.dumps(data, default=str))))  # the asked text is user text
    else:
        _print_check(data)
    if before != after:  # a read-only open must never change the file; say so loudly
        raise _fail("the database file changed during a read-only check")


def _check(store, settings: Settings, session_id: str, ask: str, expect: str | None, turn_id: int | None,  # type: ignore[no-untyped-def]
           model: str | None, device: str | None):
    from agent.probes.session_check import check_session
    from agent.runtime.state import StateError as RuntimeStateError

    s = store.core.get_session(session_id)
    turn = store.tree.get_turn(turn_id if turn_id is not None else s.head_turn_id)
    if turn.session_id != s.id:
        raise _fail(f"turn {turn.id} is not in session {s.short_id}")
    snap = store.states.latest(s.id, turn.id)
    if snap is None:
        raise _fail(f"session {s.short_id} has no saved state on this branch; resume it once with `laplace chat` to save one")
    loaded, _ = _load(model or s.model_id, device or settings.device, settings)
    data = store.states.load(snap, expected_fingerprint=loaded.fingerprint)
    fold: list[int] = []
    if snap.turn_id != turn.id:  # the snapshot predates the turn: fold only the turns since it
        for ids in store.tree.branch_token_ids(s.id, turn.id, after_turn_id=snap.turn_id):
            fold += ids
    mention = _mention(store, s, turn, expect, loaded.tokenizer) if expect else None
    try:
        return check_session(loaded, data, ask, expect=expect, fold_ids=fold, mention=mention)
    except RuntimeStateError as exc:
        raise _fail(f"{exc}; to replay the transcript: laplace chat --session {s.short_id} --rebuild-state") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _mention(store, s, turn, expect: str, tok):  # type: ignore[no-untyped-def]
    """The newest turn on the branch up to `turn` that mentions `expect`, found through the
    full-text index (not a scan of the history), with tokens and turns since."""
    from agent.probes.session_check import Mention, find_mention

    hits = [h for h in store.browse.search(expect, limit=200, include_archived=True) if h.session_uid == s.uid]
    turns = sorted((store.tree.get_turn(h.turn_id) for h in hits), key=lambda t: -t.depth)
    for t in turns:
        if t.depth > turn.depth or expect not in t.content:
            continue
        if t.id != turn.id:
            between = store.tree.page_before(s.id, turn.id, limit=turn.depth - t.depth)
            if not between or between[0].id != t.id:
                continue  # on another branch
        after = find_mention(store.tree.turn_token_ids(t.id), [tok.encode(expect), tok.encode(" " + expect)])
        within = after if after is not None else 0
        return Mention(turn_id=t.id, turns_since=turn.depth - t.depth, tokens_since=turn.tokens_total - t.tokens_total + within)
    return None


def _print_check(d: dict[str, Any]) -> None:
    lines = [f"question   {d['question']}", f"answer     {d['answer'].strip()!r}"]
    if d["expect"] is not None:
        lines.insert(0, f"{d['verdict']}: {d['reason']}")
        lines.append(f"expected   {d['expect']!r}: rank {d['rank']} of {d['n_candidates']} same-shape candidates, "
                     f"log-prob {d['logp']:.2f} vs {d['blank_logp']:.2f} from a blank state (lift {d['lift']:+.2f} nats, "
                     f"blank rank {d['blank_rank']})")
        m = d.get("mention")
        if m:
            lines.append(f"last said  turn {m['turn_id']}: {m['turns_since']} turns and {m['tokens_since']} tokens ago")
        else:
            lines.append("last said  not found in this branch's transcript")
    r = d["retention"]["slowest"]
    ret = f", about {100 * r['retained']:.3g}% of that write left" if "retained" in r else ""
    lines.append(f"heads      slowest L{r['layer']}.H{r['head']} half-life {r['half_life']:.0f} tokens at rest{ret}")
    lines.append(f"state      {d['state_tokens']} tokens folded, sha256 {d['state_sha256'][:16]}, "
                 f"bytes {'unchanged' if d['bytes_unchanged'] else 'CHANGED'}, database {'unchanged' if d['database_unchanged'] else 'CHANGED'}")
    typer.echo("\n".join(lines))

