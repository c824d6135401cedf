"""What a cache beside a model's file is keyed by, without torch (`weights` and the torch-free
`native.engine` both check the int8 cache with it)."""

from __future__ import annotations

import os
from pathlib import Path


def file_identity(file: str | Path) -> str:
    """What a cache beside `file` is keyed by: device, inode, size, modification and change
    time (a change time cannot be set back by touch or a copy tool, so an edited or
    replaced file gets a new identity)."""
    st = os.stat(file)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
