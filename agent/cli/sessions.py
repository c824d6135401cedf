"""`laplace sessions ...`: list, show, rename, rm, fork, export, search, archive, retention.

Imports only typer/rich, `sessions`, `agent.display` and the CLI's own store helpers
(never torch; `verify --replay`, and `fork` where it must replay, load the model inside the
command), so managing sessions
starts in a fraction of a second. rich is imported by the commands that print with it:
every `laplace` command imports this module to register it, and `ask` prints no table. Commands parse arguments and call the store;
every SessionError or unusable data directory becomes one `error: ...` line on stderr and
exit code 1. Stored text (names, turns, snippets) is user or model data: it is printed as
plain text, never as rich markup, with terminal control characters made visible.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer

from agent.cli.store import session_store, settings_of
from agent.display import displayable, human_bytes, json_for_terminal
from sessions import SessionStore, SessionSummary
from sessions.export import session_dict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from agent.settings import Settings

app = typer.Typer(help="Manage saved chat sessions (ids accept any unique prefix).", no_args_is_help=True)


@contextmanager
def _store(ctx: typer.Context) -> Iterator[SessionStore]:
    with session_store(settings_of(ctx)) as store:
        yield store


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _text(value: str, style: str = "") -> Text:
    """Stored text as a rich Text: never parsed as markup, controls shown as symbols."""
    from rich.text import Text

    return Text(displayable(value), style=style)


def _console() -> Console:
    from rich.console import Console

    # Wide enough that tests and pipes do not wrap table rows mid-id.
    return Console(width=max(Console().width, 120), highlight=False)


def _ago(iso: str) -> str:
    secs = (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds()
    for span, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if secs >= span:
            return f"{int(secs // span)}{unit} ago"
    return "just now"


def _summary_dict(item: SessionSummary) -> dict[str, Any]:
    return {**session_dict(item.session), "turns": item.turns, "tokens_folded": item.tokens_folded,
            "state_bytes": item.state_bytes, "snapshots": item.snapshots}


@app.command("list")
def list_(
    ctx: typer.Context,
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived sessions."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", help="Show at most N sessions."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Sessions, most recently used first."""
    with _store(ctx) as store:
        items = store.browse.list_sessions(include_archived=all_, limit=limit)
    if as_json:
        typer.echo(json_for_terminal([_summary_dict(i) for i in items]))
        return
    if not items:
        typer.echo("no sessions yet; start one with `laplace chat`")
        return
    from rich.table import Table

    table = Table("id", "name", "model", "turns", "tokens", "state", "last used")
    for i in items:
        s = i.session
        table.add_row(s.short_id, _text((s.name or "") + (" [archived]" if s.archived else "")), _text(s.model_id),
                      str(i.turns), str(i.tokens_folded), human_bytes(i.state_bytes), _ago(s.updated_at))
    _console().print(table)


@app.command()
def show(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., help="Session id or unique prefix."),
    turns: int = typer.Option(10, "--turns", "-t", help="How many recent turns to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Details of one session: branch, snapshots, retention policy, recent turns."""
    with _store(ctx) as store:
        item = store.browse.summary(session_id)
        s = item.session
        snaps = store.states.all(s.id)
        tail = store.tree.tail(s.id, turns)
        lease = store.leases.holder(s.id)
    policy = f"latest snapshot per branch + {s.keep_snapshots} older"
    if as_json:
        typer.echo(json_for_terminal({
            **_summary_dict(item), "retention": {"keep_latest_per_branch": 1, "keep_older": s.keep_snapshots},
            "in_use_by": {"pid": lease.pid, "hostname": lease.hostname} if lease else None,
            "snapshots": [{"turn_id": x.turn_id, "n_tokens": x.n_tokens, "byte_size": x.byte_size,
                           "model_fingerprint": x.model_fingerprint, "format": x.format, "dtype": x.dtype,
                           "created_at": x.created_at} for x in snaps],
            "turns": [{"turn_id": t.id, "role": t.role, "status": t.status, "content": t.content,
                       "n_tokens": t.n_tokens} for t in tail],
        }))
        return
    from rich.text import Text

    out = _console()
    out.print(Text.assemble(_text(s.name or "(unnamed)", "bold"), f"  {s.uid}"))
    out.print(Text.assemble("model ", _text(s.model_id), f" · {item.turns} turns · {item.tokens_folded} tokens folded · "
              f"state {human_bytes(item.state_bytes)} · created {s.created_at} · last used {_ago(s.updated_at)}"
              + (" · archived" if s.archived else "")))
    out.print(f"snapshots: {len(snaps)} kept; retention: {policy}", markup=False)
    if lease:
        out.print(Text.assemble(f"in use by pid {lease.pid} on ", _text(lease.hostname)))
    for t in tail:
        if t.role == "system" and not t.content:
            continue
        flag = "" if t.status == "complete" else f" ({t.status})"
        text = t.content if len(t.content) <= 200 else t.content[:200] + "…"
        out.print(Text.assemble((f"#{t.id}", "dim"), " ", (f"{t.role}{flag}", "bold"), ": ", _text(text)), soft_wrap=True)


@app.command()
def rename(ctx: typer.Context, session_id: str, name: str) -> None:
    """Give a session a name."""
    with _store(ctx) as store:
        s = store.turns.rename_session(session_id, name)
    typer.echo(f"renamed {s.short_id} to {displayable(repr(name))}")


@app.command("rm")
def rm(
    ctx: typer.Context,
    session_id: str,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a session, its transcript and its states, for good."""
    with _store(ctx) as store:
        item = store.browse.summary(session_id)
        label = f"{item.session.short_id} ({displayable(item.session.name or 'unnamed')}, {item.turns} turns)"
        if not yes and not typer.confirm(f"delete session {label}? this cannot be undone"):
            typer.echo("aborted", err=True)
            raise typer.Exit(1)
        store.browse.delete_session(item.session.id)
    typer.echo(f"deleted {label}")


@app.command()
def archive(
    ctx: typer.Context,
    session_id: str,
    undo: bool = typer.Option(False, "--undo", help="Unarchive instead."),
) -> None:
    """Hide a session from `list` (kept intact; `list --all` shows it)."""
    with _store(ctx) as store:
        s = store.turns.set_archived(session_id, not undo)
    typer.echo(f"{'unarchived' if undo else 'archived'} {s.short_id}")


@app.command()
def retention(ctx: typer.Context, session_id: str,
              keep: int = typer.Argument(..., min=0, help="Older snapshots to keep per branch.")) -> None:
    """Set how many older snapshots a session keeps per branch besides the latest."""
    with _store(ctx) as store:
        store.states.set_keep(session_id, keep)
    typer.echo(f"retention: latest snapshot per branch + {keep} older")


@app.command()
def fork(
    ctx: typer.Context,
    session_id: str,
    at: Optional[int] = typer.Option(None, "--at", help="Turn id to fork at (default: the head)."),
    name: Optional[str] = typer.Option(None, "--name", help="Name of the new session."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model for a replay, when no state up to the turn was kept (default: the session's own)."),
    device: str = typer.Option("auto", "--device", help="Device for that replay: auto | cpu | cuda | neuron."),
) -> None:
    """Copy a session (up to a turn) into a new session with its state. Where retention
    pruned every state up to that turn, the copy's transcript is replayed into one."""
    with _store(ctx) as store:
        new = store.browse.fork(session_id, at, name=name)
        stateless = store.states.latest(new.id) is None
        tokens = store.tree.get_turn(new.head_turn_id).tokens_total
    if stateless:
        _replay_fork(ctx, new.uid, model, device)
        typer.echo(f"forked at turn {new.forked_from_turn_id}, where retention had kept no state: replayed its "
                   f"{tokens:,} tokens into a new one", err=True)
    typer.echo(new.uid)


def _replay_fork(ctx: typer.Context, uid: str, model: Optional[str], device: str) -> None:
    """Give a fork that has no state one, by replaying its transcript with the model (the
    rebuild `laplace chat --rebuild-state` runs, with its progress bar). If that fails or is
    interrupted, the fork is deleted again: the command leaves a usable fork or nothing."""
    from agent.cli.chat import open_service

    try:
        service, _ = open_service(settings_of(ctx), model=model, session=uid, cont=False, device=device, options=[],
                                  rebuild_state=True, system=None)
    except BaseException:
        with _store(ctx) as store:
            store.browse.delete_session(uid)
        raise
    service.close()
    service.store.close()


@app.command()
def export(
    ctx: typer.Context,
    session_id: str,
    fmt: str = typer.Option("markdown", "--format", "-f", help="markdown or json."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Export the current branch as Markdown or JSON (JSON is what `laplace finetune` reads)."""
    if fmt not in ("markdown", "md", "json"):
        typer.echo(f"error: unknown format {fmt!r}; use markdown or json", err=True)
        raise typer.Exit(1)
    with _store(ctx) as store:
        text = (json_for_terminal(store.browse.export_json(session_id)) + "\n"
                if fmt == "json" else store.browse.export_markdown(session_id))
    if output is None:
        # A terminal gets control characters as symbols; a pipe gets the exact text.
        sys.stdout.write(displayable(text) if _stdout_is_terminal() else text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            typer.echo(f"error: cannot write {output}: {exc.strerror or exc}; choose another path", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"wrote {output}", err=True)


@app.command()
def search(
    ctx: typer.Context,
    query: str,
    limit: int = typer.Option(20, "--limit", "-n"),
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived sessions."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Full-text search over every transcript."""
    with _store(ctx) as store:
        hits = store.browse.search(query, limit=limit, include_archived=all_)
    if as_json:
        typer.echo(json_for_terminal([{"session": h.session_uid, "session_name": h.session_name, "turn_id": h.turn_id,
                                       "role": h.role, "snippet": h.snippet, "created_at": h.created_at} for h in hits]))
        return
    if not hits:
        typer.echo("no matches")
        return
    from rich.text import Text

    out = _console()
    for h in hits:
        out.print(Text.assemble(f"{h.session_uid[:8]} #{h.turn_id} {h.role}: ", _text(h.snippet)), soft_wrap=True)


# ---- verify: a deep check of state vs transcript (the logic lives in agent/chat/verify.py)


@app.command()
def verify(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., help="Session id or unique prefix."),
    replay: bool = typer.Option(False, "--replay", help="Also replay the transcript with the model and compare the stored state (O(history))."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model for --replay (default: the session's own)."),
    device: Optional[str] = typer.Option(None, "--device", help="Device for --replay: auto | cpu | cuda | neuron."),
) -> None:
    """Recompute the hash chain over the current branch's token ids and check its snapshots;
    exit 1 with the way out (--rebuild-state) if the state disagrees with the transcript."""
    from agent.chat.verify import VerifyFailed, verify_session
    from agent.cli.errors import fail

    settings = settings_of(ctx)
    try:
        with _store(ctx) as store:
            lines = verify_session(store, session_id)
            if replay:
                lines.append(_replay(store, session_id, model, device or settings.device, settings))
    except VerifyFailed as exc:
        raise fail(str(exc)) from None
    for line in lines:
        typer.echo(line)


def _replay(store: SessionStore, ref: str, model: Optional[str], device: str, settings: Settings) -> str:
    """Load the model (the session's own unless -m) as `chat` loads it with torch (in its
    card's dtype: the default model's int8, whose fingerprint its states carry) and compare a
    replay with the stored state."""
    from agent.chat.verify import compare_replay, newest_snapshot
    from agent.cli.chat import load_model_as
    from agent.runtime.generation import EagerRunner

    session, snap = newest_snapshot(store, ref)
    lm, _, _ = load_model_as(settings, model or session.model_id, device)
    return compare_replay(store, session, snap, lm, EagerRunner(lm.model)).line()
