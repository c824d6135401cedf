"""Settings read from the environment once, at the CLI's edge, and passed down explicitly.

Nothing else in the project reads environment variables: tests build a `Settings` with a
temporary home instead of mutating globals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


def _default_home() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("laplace", appauthor=False))


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where data lives and which device and dtype the runtime should use."""

    home: Path
    device: str = "auto"
    dtype: str = "float32"

    @property
    def db_path(self) -> Path:
        return self.home / "laplace.db"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        home = Path(env["LAPLACE_HOME"]).expanduser() if env.get("LAPLACE_HOME") else _default_home()
        return cls(
            home=home,
            device=env.get("LAPLACE_DEVICE", "auto"),
            dtype=env.get("LAPLACE_DTYPE", "float32"),
        )

    def ensure_home(self) -> Path:
        """Create the data directory, private to its owner."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.home
