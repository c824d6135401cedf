"""Download pinned registry artifacts into a cache, sha256-checked, and read files inside them.

Each registry's ordinary client does the download (`pip download`, `apt-get download`,
`npm pack`) into a private temporary folder; the file is then hashed and moved into the cache
only if its sha256 is the pinned one. A file whose hash differs, freshly downloaded or already
cached, is deleted; a fresh mismatch is refused with `ChecksumError`. A cached file with the
right hash is never fetched again, so a rerun after an interruption resumes where it stopped.

`members` reads files out of a wheel (zip), an npm tarball (tar.gz) or a Debian package (an
`ar` archive holding data.tar.xz / .gz) with the standard library alone: no dpkg needed.
"""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.importers.download import sha256_of as sha256_file
from recipes.smollm2_hybrid.corpus.sources import Artifact

Downloader = Callable[[Artifact, Path], None]  # writes the artifact's file into the folder it is given


class ChecksumError(RuntimeError):
    pass


class FetchError(RuntimeError):
    pass


def registry_command(art: Artifact, folder: Path) -> list[str]:
    """The registry client's own command that writes `art`'s file into `folder`."""
    if art.registry == "pypi":
        return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                "-q", art.pin, "-d", str(folder)]
    if art.registry == "debian":
        return ["apt-get", "download", "-q", art.pin]
    if art.registry == "npm":
        return ["npm", "pack", "--silent", art.pin, "--pack-destination", str(folder)]
    raise ValueError(f"unknown registry {art.registry!r}")


def registry_download(art: Artifact, folder: Path) -> None:
    cmd = registry_command(art, folder)
    try:
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=1800, check=False)
    except FileNotFoundError as e:
        raise FetchError(f"{art.pin}: the {art.registry} client is not installed ({e.filename})") from e
    if done.returncode != 0:
        hint = " (run `apt-get update` first?)" if art.registry == "debian" else ""
        raise FetchError(f"{art.pin}: {' '.join(cmd[:3])} failed{hint}: {done.stderr.strip()[-400:]}")


def fetch(art: Artifact, cache: Path, download: Downloader = registry_download, log: Callable[[str], None] = print) -> Path:
    """The cached, verified file of `art`, downloading it first if needed."""
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / art.filename
    if dest.exists():
        if sha256_file(dest) == art.sha256:
            return dest
        log(f"  {art.filename}: cached file has the wrong sha256, deleted; downloading again")
        dest.unlink()
    log(f"  downloading {art.registry}:{art.pin}")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        folder = Path(tmp)
        download(art, folder)
        got = [p for p in folder.iterdir() if p.is_file()]
        if len(got) != 1:
            raise FetchError(f"{art.pin}: expected one downloaded file, found {sorted(p.name for p in got)}")
        digest = sha256_file(got[0])
        if digest != art.sha256:
            got[0].unlink()
            raise ChecksumError(f"{art.pin}: sha256 {digest} is not the pinned {art.sha256}; the file was deleted")
        os.replace(got[0], dest)
    return dest


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _deb_data(path: Path) -> tarfile.TarFile:
    """The data.tar.* member of a .deb (an `ar` archive), opened as a tar file."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{path.name}: not a Debian package")
        while header := f.read(60):
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith("data.tar"):
                if name.endswith(".zst"):
                    raise FetchError(f"{path.name}: zstd-compressed data is not supported")
                return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    raise FetchError(f"{path.name}: no data.tar member")


def members(path: Path, patterns: tuple[str, ...], exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    """(path inside, bytes) of every regular file in the artifact matching `patterns` and not
    `exclude`, sorted by path (so every run reads them in the same order)."""
    name = path.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            for n in sorted(z.namelist()):
                if not n.endswith("/") and _matches(n, patterns) and not _matches(n, exclude):
                    yield n, z.read(n)
        return
    with _deb_data(path) if name.endswith(".deb") else tarfile.open(path, "r:*") as tar:
        chosen = {}
        for m in tar.getmembers():
            n = m.name.removeprefix("./")
            if m.isfile() and _matches(n, patterns) and not _matches(n, exclude):
                chosen[n] = m
        for n in sorted(chosen):
            f = tar.extractfile(chosen[n])
            assert f is not None
            yield n, f.read()


def copy_local(src: Path) -> Downloader:
    """A downloader that copies one local file (for tests and offline mirrors)."""
    def download(art: Artifact, folder: Path) -> None:
        shutil.copy(src, folder / art.filename)
    return download
