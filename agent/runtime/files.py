"""Caches beside a model's files, without torch: what they are keyed by (`file_identity`) and
the digests a load keeps (`DigestCache`). `weights`, `modeldir` and the torch-free
`native.engine` all read them."""

from __future__ import annotations

import json
import os
from pathlib import Path


def file_identity(file: str | Path) -> str:
    """What a cache beside `file` is keyed by: device, inode, size, modification and change
    time (a change time cannot be set back by touch or a copy tool, so an edited or
    replaced file gets a new identity)."""
    st = os.stat(file)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class DigestCache:
    """Digests of a file of a model directory (the weights', the tokenizer's), kept in one
    JSON file beside it, each valid while its file is the same (`file_identity`), so an
    edited or replaced file misses. A directory that cannot be written simply has no cache."""

    NAME = ".laplace-digest.json"

    def __init__(self, file: str | Path, *, enabled: bool = True) -> None:
        self.file = Path(file)
        self.path = self.file.parent / self.NAME
        self.enabled = enabled  # off: every get misses and nothing is written
        self._key = file_identity(self.file)

    def _read(self) -> dict:  # type: ignore[type-arg]
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, kind: str) -> str | None:
        if not self.enabled:
            return None
        entry = self._read().get(self.file.name)
        if not isinstance(entry, dict) or entry.get("file") != self._key or not isinstance(entry.get("digests"), dict):
            return None
        value = entry["digests"].get(kind)
        return value if isinstance(value, str) and len(value) == 64 else None

    def put(self, kind: str, digest: str) -> None:
        if not self.enabled:
            return
        data = self._read()
        entry = data.get(self.file.name)
        digests = entry["digests"] if isinstance(entry, dict) and entry.get("file") == self._key \
            and isinstance(entry.get("digests"), dict) else {}
        data[self.file.name] = {"file": self._key, "digests": {**digests, kind: digest}}
        tmp = self.path.with_name(f"{self.NAME}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:  # a read-only model directory: no cache, the digest is computed each load
            tmp.unlink(missing_ok=True)
