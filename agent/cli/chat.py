"""`laplace chat` and `laplace ask`: build the chat service from flags and run a front end.

This module wires concrete objects (settings, session store, model, runner, service);
the service and the TUI never construct their own dependencies.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click
import typer
from typer.core import TyperCommand

from agent import timings
from agent.cli.errors import fail as _fail, progress_line
from agent.cli.store import settings_of
from agent.settings import Settings

if TYPE_CHECKING:
    from agent.chat.service import ChatService

DEFAULT_MODEL = "default"
DEMO_NOTICE = ("demo model: a 4.9 M model trained on this project's CPU for tests; it does not really chat. "
               "The default model (SmolLM2-135M as a fixed-state hybrid) needs one download: drop -m demo.")
INITIAL_STATE_HELP = "Start new sessions from a learned initial state (laplace finetune --tune state)."
OPTION_HELP = "Option KEY VALUE (or KEY=VALUE): temperature, top_k, top_p, repetition_penalty, max_new_tokens, seed, stop; recall refresh: refresh (on|off), refresh_tokens, refresh_horizon."

# Options shared by `ask` and `chat` (one declaration each, so the two cannot drift).
CONTINUE_OPT = typer.Option(False, "-c", "--continue", help="Continue the most recently updated session.")
SESSION_OPT = typer.Option(None, "--session", help="Continue this session (unique id prefix).")
MODEL_OPT = typer.Option(None, "-m", "--model", help="Model name or directory (default: the session's, or the default model, built on first use; demo: the bundled demo).")
SYSTEM_OPT = typer.Option(None, "-s", "--system", help="System prompt for a new session.")
SAMPLING_OPT = typer.Option(None, "-o", "--option", help=OPTION_HELP)
DEVICE_OPT = typer.Option("auto", "--device", help="auto | cpu | cuda | neuron")
REBUILD_OPT = typer.Option(False, "--rebuild-state", help="Replay the transcript into a new state (the way out when the stored one is refused or fails `laplace sessions verify`).")
INITIAL_STATE_OPT = typer.Option(None, "--initial-state", help=INITIAL_STATE_HELP)


def join_option_pairs(argv: list[str]) -> list[str]:
    """Rewrite `-o KEY VALUE` as `-o KEY=VALUE` (click cannot declare a repeated two-value
    option through Typer); `-o KEY=VALUE` passes through. Stops at `--`."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg in ("-o", "--option") and i + 2 < len(argv) and "=" not in argv[i + 1]:
            out += [arg, f"{argv[i + 1]}={argv[i + 2]}"]
            i += 3
            continue
        out.append(arg)
        i += 1
    return out


class OptionPairsCommand(TyperCommand):
    """`chat` and `ask` read `-o KEY VALUE` pairs; only their own arguments are rewritten,
    so another command's `-o` (`sessions export -o FILE`, `bench -o FILE`, `finetune -o DIR`)
    keeps its one value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, join_option_pairs(args))


def parse_option_pairs(raw: Optional[list[str]]) -> list[tuple[str, str]]:
    pairs = []
    for item in raw or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"sampling option {item!r} needs a value: -o KEY VALUE")
        pairs.append((key.strip(), value))
    return pairs




def open_service(settings: Settings, *, model: Optional[str], session: Optional[str], cont: bool, device: str,
                 options: list[tuple[str, str]], rebuild_state: bool, system: Optional[str],
                 defer_unusable: bool = False, initial_state: Optional[Path] = None) -> tuple["ChatService", Optional[Exception]]:
    """Resolve the model (a resumed session's own model unless -m is given), open the store,
    build the service and open or resume the session. Raises typer.Exit with a one-line error.

    With `rebuild_state` the transcript is replayed into a new state; otherwise a stored
    state that cannot be used is returned as the second value with `defer_unusable` (the
    TUI asks the user), or else an error."""
    with timings.phase("imports: the chat service"):
        from agent.chat.options import parse_pairs
        from agent.chat.service import ChatService
        from agent.chat.types import ChatError, StateUnusableError
        from agent.cli.store import open_store
        from sessions import SessionError

    if session and cont:
        raise _fail("use either -c/--continue or --session ID, not both")
    if system is not None and (session or cont):
        raise _fail("--system applies to a new session; a resumed state has already read its system prompt (use /system in chat to start a new session)")
    try:
        given = parse_pairs(options)  # a resumed session keeps its stored options, with these on top
    except ValueError as exc:
        raise _fail(str(exc)) from None
    with timings.phase("store: open"):
        store = open_store(settings)
    try:
        target = None
        if session or cont:
            target = store.core.get_session(session) if session else store.browse.most_recent_session()
            if target is None:
                raise _fail("there is no session to continue yet; start one with `laplace chat` or `laplace ask`")
        spec = model or (target.model_id if target else DEFAULT_MODEL)
        with timings.phase("model: load"):
            # The torch-free engine where it runs this model; torch for what it alone does:
            # a learned initial state, and a rebuild (the reference replay verify points to).
            lm, model_id, dev, runner = open_model(settings, spec, device, engine_ok=initial_state is None and not rebuild_state)
        start = None
        if initial_state is not None:
            from agent.runtime.state import StateError as RuntimeStateError
            from agent.train.initial_state import load_initial_state

            try:
                start = load_initial_state(initial_state, lm, device=dev)
            except FileNotFoundError:
                raise _fail(f"initial state {initial_state} does not exist; make one with laplace finetune --tune state") from None
            except RuntimeStateError as exc:
                raise _fail(f"initial state {initial_state}: {exc}") from None
        with timings.phase("service: build"):
            service = ChatService(store, lm, model_id=model_id, runner=runner, device=str(dev),
                                  options=given, initial_state=start, check=_check_state)
        unusable: Optional[Exception] = None
        try:
            if target is None:
                service.new_session(system=system)
            else:
                try:
                    with timings.phase("session: resume (lease, recovery, hash chain, state)"):
                        service.resume(target.uid, progress=lambda ev: progress_line(ev.label, ev.done, ev.total))
                except StateUnusableError as exc:
                    if defer_unusable and not rebuild_state:
                        unusable = exc
                    elif not rebuild_state:
                        raise _fail(str(exc)) from None
                # Asked for, a rebuild runs even when the stored state passed its checks:
                # `laplace sessions verify --replay` can find a state that differs from a
                # replay although its hashes agree, and points here.
                if rebuild_state:
                    for ev in service.rebuild_state():
                        progress_line(ev.label, ev.done, ev.total)
        except ChatError as exc:
            service.close()
            raise _fail(str(exc)) from None
        except BaseException:  # e.g. Ctrl-C during a rebuild: give the session's lease back
            service.close()
            raise
        return service, unusable
    except SessionError as exc:
        store.close()
        raise _fail(str(exc)) from None
    except BaseException:
        store.close()
        raise


def _check_state(lm, state, *args, **kwargs):  # type: ignore[no-untyped-def]
    """`agent.probes.session_check.check_state`, imported when a chat first asks (/check):
    `ask` never does, and the probes would add to its start-up. The probes run on torch: a
    chat on the engine hands them the same model and state in torch's form (`torch_twin`)."""
    from agent.probes.session_check import check_state

    if hasattr(lm, "torch_twin"):
        lm, state = lm.torch_twin(state)
    return check_state(lm, state, *args, **kwargs)


def open_model(settings: Settings, spec: str, device: str, *, engine_ok: bool):  # type: ignore[no-untyped-def]
    """(model, the id sessions store for it, device, runner) for `chat` and `ask`: on the
    torch-free engine (`agent.runtime.native.runner`) when `engine_ok` and it runs this
    model here (`engine_for`), else on torch (`load_model_as`). typer.Exit on failure."""
    with timings.phase("built and up to date (default: shipped parameters)"):
        _ensure(settings, spec)
    path, model_id = resolve_as(settings, spec)
    if engine_ok:
        with timings.phase("engine: map the weights"):
            em = engine_for(settings, spec, path, device)
        if em is not None:
            from agent.runtime.native.runner import EngineRunner

            return em, model_id, "cpu", EngineRunner(em.engine)
    lm, model_id, dev = load_model_as(settings, spec, device, ensured=True)
    return lm, model_id, dev, make_runner(lm.model, dev, settings)


def _ensure(settings: Settings, spec: str) -> None:
    """Build the default model on first use (or apply shipped parameters that changed)."""
    from agent.cli.models import ensure_model

    ensure_model(settings, spec)


def resolve_as(settings: Settings, spec: str) -> tuple[Optional[Path], str]:
    """The model's directory (None for a preset) and the id sessions store for it.

    Names (default, user models, presets) are stored as names, so a session survives the
    package or LAPLACE_HOME moving; an explicit directory is stored as an absolute path."""
    from agent.runtime.modeldir import PACKAGED_MODELS, resolve_model_path

    path = resolve_model_path(spec, settings.models_dir)
    named = path is None or ("/" not in spec and path.parent.resolve() in (settings.models_dir.resolve(), PACKAGED_MODELS.resolve()))
    return path, spec if named else str(path.resolve())


def engine_for(settings: Settings, spec: str, path: Optional[Path], device: str):  # type: ignore[no-untyped-def]
    """The model on the torch-free engine, or None where torch runs it: LAPLACE_ENGINE=torch;
    a device other than the CPU (`auto` counts as the CPU for an int8 model, whose torch form
    is CPU-only, and for any model on a machine with no NVIDIA or Neuron driver); a dtype
    other than int8 or float32; a model the engine cannot run, or whose caches the first
    torch load has not written yet (that load writes them; the next start maps them).
    LAPLACE_ENGINE=native makes that last case an error naming the reason."""
    from agent.runtime.modeldir import ModelLoadError, card_run_dtype

    if settings.engine == "torch" or path is None:
        return None
    try:
        dtype = settings.dtype if settings.dtype_set else card_run_dtype(spec, settings.models_dir)
    except ModelLoadError as exc:
        raise _fail(str(exc)) from None
    weights = {"int8": "int8", "float32": "fp32", "fp32": "fp32"}.get(dtype)
    wanted = device if device != "auto" else settings.device
    accelerator = Path("/proc/driver/nvidia").exists() or Path("/dev/neuron0").exists()
    on_cpu = wanted == "cpu" or (wanted == "auto" and (weights == "int8" or not accelerator))
    why = None if weights is not None and on_cpu else f"device {wanted} with dtype {dtype}"
    if why is None:
        from agent.runtime.native.engine import EngineUnavailable
        from agent.runtime.native.runner import open_engine_model

        try:
            em = open_engine_model(path, weights=weights, threads=min(2, os.cpu_count() or 1))
            timings.mark(f"runtime: the torch-free engine ({weights})")
            return em
        except (EngineUnavailable, ModelLoadError) as exc:  # the torch load words a broken directory's error
            why = str(exc)
    if settings.engine == "native":
        raise _fail(f"LAPLACE_ENGINE=native, but the engine cannot run {spec}: {why}; unset LAPLACE_ENGINE to use torch")
    timings.mark(f"runtime: torch ({why})")
    return None


def load_model_as(settings: Settings, spec: str, device: str, *, ensured: bool = False):  # type: ignore[no-untyped-def]
    """Load model `spec` with torch on `device` (auto: the settings' device) in the settings'
    dtype; returns (LoadedModel, the id sessions store for it, torch device). typer.Exit on
    failure. `ensured`: the caller has just built or updated it (`_ensure`)."""
    with timings.phase("imports: torch and the runtime"):
        from agent.runtime.checkpoint import ModelLoadError, card_run_dtype, load_model
        from agent.runtime.device import DeviceUnavailableError, parse_dtype, resolve_device
        from agent.runtime.quant import QUANT_MODES

    if not ensured:
        with timings.phase("built and up to date (default: shipped parameters)"):
            _ensure(settings, spec)
    try:
        _, model_id = resolve_as(settings, spec)
        dev = resolve_device(device if device != "auto" else settings.device)
        # LAPLACE_DTYPE, else the model card's dtype. int8: int8 weight-only matmuls, read
        # straight from the file into that form.
        dtype = settings.dtype if settings.dtype_set else card_run_dtype(spec, settings.models_dir)
        quant = dtype if dtype in QUANT_MODES else None
        lm = load_model(spec, device=dev, dtype=parse_dtype("float32" if quant else dtype), models_dir=settings.models_dir,
                        quant=quant, decode_layout=True)
    except ModelLoadError as exc:
        hint = f" (remove {settings.models_dir / DEFAULT_MODEL} to build it again, or use -m demo)" if spec == DEFAULT_MODEL else ""
        raise _fail(f"{exc}{hint}") from None
    except (DeviceUnavailableError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if lm.card.get("demo"):
        typer.echo(DEMO_NOTICE, err=True)
    return lm, model_id, dev


def make_runner(model, device, settings: Settings):  # type: ignore[no-untyped-def]
    """Eager on CPU and CUDA; on Trainium, compiled over fixed shape buckets, with the compile
    cache in a persistent directory so a restart does not recompile every bucket."""
    import os

    from agent.runtime.generation import EagerRunner

    if device.type != "neuron":
        return EagerRunner(model)
    from agent.runtime.compiled import CompiledRunner

    os.environ.setdefault("TORCH_NEURONX_NEFF_CACHE_DIR", str(settings.home / "neff-cache"))
    return CompiledRunner(model, backend="neuron", segment_len=512)


def read_prompt(prompt: str) -> str:
    if prompt == "-":
        raw = sys.stdin.buffer.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(f"stdin is not UTF-8 text (bad byte at offset {exc.start}); re-encode it as UTF-8") from None
    else:
        text = prompt
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("the prompt is not valid UTF-8; re-encode it as UTF-8") from None
    if not text.strip():
        raise _fail("the prompt is empty; pass text or '-' to read stdin")
    return text


def ask(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="The message; '-' reads it from stdin."),
    cont: bool = CONTINUE_OPT,
    session: Optional[str] = SESSION_OPT,
    model: Optional[str] = MODEL_OPT,
    system: Optional[str] = SYSTEM_OPT,
    option: Optional[list[str]] = SAMPLING_OPT,
    device: str = DEVICE_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the turn as JSON instead of streaming text."),
    rebuild_state: bool = REBUILD_OPT,
    initial_state: Optional[Path] = INITIAL_STATE_OPT,
) -> None:
    """One turn without the TUI: streamed to stdout and persisted like a TUI turn."""
    from agent.chat.types import ChatError, ProgressEvent, StatsEvent, TokenEvent, TurnFinished, TurnResult, TurnStarted

    text = read_prompt(prompt)
    service, _ = open_service(settings_of(ctx), model=model, session=session, cont=cont, device=device, options=parse_option_pairs(option),
                              rebuild_state=rebuild_state, system=system, initial_state=initial_state)
    from agent.display import displayable, json_for_terminal

    show = displayable if sys.stdout.isatty() else (lambda text: text)  # pipes get the exact bytes
    started = finished = stats = None
    session_uid = service.session.uid if service.session else ""
    try:
        for ev in service.send(text):
            if isinstance(ev, TokenEvent) and not as_json:
                sys.stdout.write(show(ev.text))
                sys.stdout.flush()
                timings.mark("first token printed")
            elif isinstance(ev, TurnStarted):
                started = ev
            elif isinstance(ev, ProgressEvent):  # a long message being folded, on stderr
                progress_line(ev.label, ev.done, ev.total)
            elif isinstance(ev, StatsEvent):
                stats = ev
            elif isinstance(ev, TurnFinished):
                finished = ev.turn
    except KeyboardInterrupt:
        typer.echo("\ncancelled: the partial reply was saved, marked cancelled" if started is not None else
                   "\ncancelled: your message was saved; the state reads it when the session is next opened", err=True)
        raise typer.Exit(130) from None
    except ChatError as exc:
        raise _fail(str(exc)) from None
    finally:
        service.close()
        service.store.close()
    assert started is not None and finished is not None
    if as_json:
        result = TurnResult(
            session_uid=session_uid, user_turn_id=started.user_turn.id if started.user_turn else 0,
            assistant_turn_id=finished.id, reply=finished.content, status=finished.status,
            new_tokens=stats.new_tokens if stats else 0, tokens_per_s=stats.tokens_per_s if stats else 0.0,
            tokens_folded=stats.tokens_folded if stats else 0)
        if started.recall_turn is not None:  # recall refresh folded a block before the message
            result.extra["recall"] = {"turn_id": started.recall_turn.id, "tokens": started.recall_turn.n_tokens,
                                      "text": started.recall_turn.content}
        typer.echo(json_for_terminal(asdict(result), indent=None))  # one line; no raw DEL or C1 controls
    else:
        sys.stdout.write("\n")
    if finished.status == "error":
        raise _fail("generation failed; the partial reply was saved, marked error")


def load_keymap(path: Optional[Path], home: Path) -> dict[str, str] | None:
    """`[keys]` of a TOML file: binding id -> "key[,key]", checked before the model loads.
    Default: $LAPLACE_HOME/keymap.toml, used only if it exists; a --keymap file must exist."""
    import tomllib

    from agent.tui.factory import checked_keymap

    if path is not None and not path.is_file():
        raise _fail(f"keymap {path} does not exist; check the --keymap path" if not path.exists()
                    else f"keymap {path} is not a file; pass a TOML file to --keymap")
    path = path or home / "keymap.toml"
    if not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise _fail(f"keymap {path} is not valid TOML ({exc}); fix or remove it") from None
    table = "a [keys] table of binding id = \"key,key\""
    other = sorted(set(data) - {"keys"})
    if other:
        raise _fail(f"keymap {path}: unexpected {other[0]!r} outside [keys]; put bindings in {table}")
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise _fail(f"keymap {path}: [keys] must be {table}")
    try:
        return checked_keymap(keys)
    except ValueError as exc:
        raise _fail(f"{path}: {exc}") from None


def chat(
    ctx: typer.Context,
    cont: bool = CONTINUE_OPT,
    session: Optional[str] = SESSION_OPT,
    model: Optional[str] = MODEL_OPT,
    system: Optional[str] = SYSTEM_OPT,
    option: Optional[list[str]] = SAMPLING_OPT,
    device: str = DEVICE_OPT,
    rebuild_state: bool = REBUILD_OPT,
    keymap: Optional[Path] = typer.Option(None, "--keymap", help="TOML file with a \\[keys] table: binding id = \"key,key\"."),
    initial_state: Optional[Path] = INITIAL_STATE_OPT,
) -> None:
    """The chat TUI: a new session, or resume one with -c / --session."""
    settings = settings_of(ctx)
    keys = load_keymap(keymap, settings.home)
    service, unusable = open_service(settings, model=model, session=session, cont=cont, device=device,
                                     options=parse_option_pairs(option), rebuild_state=rebuild_state,
                                     system=system, defer_unusable=True, initial_state=initial_state)
    from agent.tui.factory import create_app

    try:
        try:
            app = create_app(service, keymap=keys, startup_error=unusable)
        except ValueError as exc:  # an unknown binding id in the keymap
            raise _fail(str(exc)) from None
        app.run()
    finally:
        service.close()
        service.store.close()


def register(app: typer.Typer) -> None:
    app.command("ask", cls=OptionPairsCommand)(ask)
    app.command("chat", cls=OptionPairsCommand)(chat)
