"""The download stops at the pinned size, refuses a longer body, and reports itself done
only once the size and the sha256 check out (served from 127.0.0.1 with Range support)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent.importers.download import DownloadError, download

from .helpers import RangeServer

BLOB = bytes(range(256)) * 9000  # 2.3 MB: a few 1 MB chunks


def _get(server: RangeServer, dest: Path, **kw):  # type: ignore[no-untyped-def]
    seen: list[tuple[int, int]] = []
    try:
        download(server.url, dest, sha256=kw.get("sha256", hashlib.sha256(BLOB).hexdigest()), size=len(BLOB),
                 progress=lambda done, total: seen.append((done, total)))
    finally:
        server.close()
    return seen


def test_a_body_longer_than_the_pinned_size_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    server = RangeServer(BLOB, extra=b"and then some more bytes")
    with pytest.raises(DownloadError, match="more than the pinned"):
        _get(server, tmp_path / "f.whl")
    assert list(tmp_path.iterdir()) == []  # neither the file nor a .part to resume from


def test_the_part_file_never_grows_past_the_pinned_size(tmp_path: Path) -> None:
    # A wrong body of the pinned length plus more: what is written stops at the pinned size
    # (then the rest is refused), so no disk is spent past it.
    server = RangeServer(b"x" * len(BLOB), extra=b"x" * (4 << 20))
    seen: list[int] = []
    import agent.importers.download as dl

    real_open = open

    def spying_open(path, mode="r", *a, **kw):  # type: ignore[no-untyped-def]
        f = real_open(path, mode, *a, **kw)
        if str(path).endswith(".part"):
            write = f.write

            def counted(b):  # type: ignore[no-untyped-def]
                seen.append(len(b))
                return write(b)

            f.write = counted
        return f

    dl.open = spying_open  # type: ignore[attr-defined]
    try:
        with pytest.raises(DownloadError):
            _get(server, tmp_path / "f.whl")
    finally:
        del dl.open  # type: ignore[attr-defined]
    assert sum(seen) == len(BLOB)


def test_progress_reaches_done_only_after_the_checks(tmp_path: Path) -> None:
    short = RangeServer(BLOB, cut_after=700_000)
    calls: list[tuple[int, int]] = []
    with pytest.raises(DownloadError, match="stopped at"):
        try:
            download(short.url, tmp_path / "f.whl", sha256=hashlib.sha256(BLOB).hexdigest(), size=len(BLOB),
                     progress=lambda d, t: calls.append((d, t)))
        finally:
            short.close()
    assert calls and all(d < t for d, t in calls)  # the bar never said 100%
    wrong, calls = RangeServer(BLOB), []
    with pytest.raises(DownloadError, match="sha256"):
        try:
            download(wrong.url, tmp_path / "g.whl", sha256="0" * 64, size=len(BLOB), progress=lambda d, t: calls.append((d, t)))
        finally:
            wrong.close()
    assert calls and all(d < t for d, t in calls)
    good = RangeServer(BLOB)
    seen = _get(good, tmp_path / "h.whl")
    assert seen[-1] == (len(BLOB), len(BLOB)) and all(d < t for d, t in seen[:-1])
    assert (tmp_path / "h.whl").read_bytes() == BLOB
