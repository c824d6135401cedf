"""A resumable, checksummed download of one file over HTTP(S), with the standard library.

`download(url, dest, sha256=..., size=...)` writes `dest.part` and asks the server for the
rest of it (an HTTP Range request) when a previous attempt stopped part-way, so a dropped
connection or a Ctrl-C costs only what was in flight. It never writes past the pinned size
(a longer body is refused), and the finished file is checked against its pinned size and
sha256 before it is renamed to `dest` and reported done; a file that does not match is
deleted and refused, never used.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional

CHUNK = 1 << 20
Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class DownloadError(Exception):
    """The file could not be fetched, or what arrived is not the file that was pinned."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, *, sha256: str, size: int, progress: Optional[Progress] = None,
             timeout: float = 30.0) -> Path:
    """Fetch `url` to `dest` unless `dest` is already there and intact; return `dest`."""
    dest = Path(dest)
    if dest.is_file() and dest.stat().st_size == size and sha256_of(dest) == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if have > size:  # not a prefix of this file: start again
        part.unlink()
        have = 0
    if have < size:
        _fetch_rest(url, part, have, size, progress, timeout)
    got_size = part.stat().st_size
    if got_size < size:  # the connection ended early: keep it, the next try resumes
        raise DownloadError(f"the download of {url} stopped at {got_size:,} of {size:,} bytes; run the command again to resume it")
    digest = sha256_of(part)
    if got_size != size or digest != sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{url} arrived as {got_size:,} bytes with sha256 {digest[:16]}..., not the pinned {size:,} bytes / "
            f"{sha256[:16]}...; the file was deleted; run the command again to download it afresh"
        )
    os.replace(part, dest)
    if progress:  # only now is it done: the size and the sha256 are the pinned ones
        progress(size, size)
    return dest


def _fetch_rest(url: str, part: Path, have: int, size: int, progress: Optional[Progress], timeout: float) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "laplace"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if have and response.status != 206:  # the server ignored the range: take the whole file
                have = 0
            with open(part, "r+b" if have else "wb") as f:
                f.seek(have)
                f.truncate()
                done = have
                while done < size:  # never past the pinned size
                    block = response.read(min(CHUNK, size - done))
                    if not block:
                        break
                    f.write(block)
                    done += len(block)
                    if progress and done < size:  # "all of it" is said once it is checked
                        progress(done, size)
                longer = done >= size and response.read(1)
            if longer:  # more than the pinned file: not it, whatever its first bytes say
                part.unlink(missing_ok=True)
                raise DownloadError(f"{url} sent more than the pinned {size:,} bytes, so it is not the pinned file; "
                                    f"nothing was kept; check the URL (or the server) and run the command again")
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"{url}: the server answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        kept = part.is_file() and part.stat().st_size > 0
        then = "what arrived is kept and the next try resumes it" if kept else "check the network and try again"
        raise DownloadError(f"cannot download from {urllib.parse.urlsplit(url).netloc or url} ({reason}); {then}") from None
    except OSError as exc:
        raise DownloadError(f"cannot write {part} ({exc.strerror or exc}); free some space or fix its permissions") from None
