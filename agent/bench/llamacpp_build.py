"""llama.cpp's `llama-bench` and `llama-quantize`, built once from llama-cpp-python's vendored source.

The prebuilt llama.cpp wheels on PyPI need a newer glibc or libstdc++ than Debian 12 has, and
building all of llama-cpp-python takes ~20 minutes. So the bench fetches the pinned sdist with
pip's own client (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`), checks
its sha256, extracts only `vendor/llama.cpp/`, and builds the two tools it needs with cmake
(about 6 minutes on 2 cores):

    $LAPLACE_HOME/tools/.build-llama.cpp-0.3.36/   the sdist, the source and the cmake tree (scratch)
    $LAPLACE_HOME/tools/llama.cpp-0.3.36/          what is kept: bin/llama-bench, bin/llama-quantize,
                                                   converter/ (convert_hf_to_gguf.py, conversion/,
                                                   gguf-py/, the GPT-NeoX vocabulary) and build.json

The libraries are linked statically (BUILD_SHARED_LIBS=OFF) so the two binaries can be moved
out of the cmake tree; build.json, written last and renamed into place with its directory, is
what says a build is complete. A lock file keeps two first uses from building at once; the
scratch directory is kept until the tools are in place, so an interrupted build resumes.
"""

from __future__ import annotations

import fcntl
import json
import platform
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from agent.importers.download import sha256_of

VERSION = "0.3.36"  # llama-cpp-python, whose vendor/llama.cpp is built
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI serves it.
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
VENDOR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
BASE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")
# ggml's AMX path (compiled in by -march=native on CPUs with AMX, e.g. Sapphire Rapids) segfaults
# here in every quantized prefill (ggml_backend_amx_mul_mat; llama.cpp issue #20824, open, unfixed),
# while F32 and batch-1 decode run. Explicit -mno-amx-* outrank what -march=native implies, so
# ggml builds its AVX-512 / VNNI kernels and CPU repacking instead, as on a CPU without AMX.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_flags(machine: str | None = None) -> tuple[str, ...]:
    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        return (*BASE_FLAGS, f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
    return BASE_FLAGS


CMAKE_FLAGS = cmake_flags()
TARGETS = ("llama-bench", "llama-quantize")
# What the Mamba-2 rows need of the source to convert a checkpoint (relative to vendor/llama.cpp).
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "models/ggml-vocab-gpt-neox.gguf", "LICENSE")

# Seconds: generous for a 2-core machine, but a hung step ends with an error rather than never.
PIP_TIMEOUT_S = 900
CONFIGURE_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3 * 3600

Log = Callable[[str], None]


class BuildError(Exception):
    """llama.cpp's tools cannot be had here; the message names the problem and the way out."""


@dataclass(frozen=True)
class LlamaCpp:
    """The built tools: where they are and what they were built from."""

    root: Path
    version: str = VERSION

    @property
    def bench(self) -> Path:
        return self.root / "bin" / "llama-bench"

    @property
    def quantize(self) -> Path:
        return self.root / "bin" / "llama-quantize"

    @property
    def converter(self) -> Path:
        return self.root / "converter"


def tools_dir(home: Path) -> Path:
    return Path(home) / "tools" / f"llama.cpp-{VERSION}"


def is_complete(root: Path) -> bool:
    """The tools are all there and were built the way this version builds them (a build with
    other flags, e.g. one with ggml's AMX path, is built again)."""
    try:
        info = json.loads((root / "build.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("cmake_flags") == list(CMAKE_FLAGS) and all((root / "bin" / t).is_file() for t in TARGETS)


def from_dir(root: Path) -> LlamaCpp:
    """Tools someone built themselves (`--llama-cpp DIR`): DIR/bin/llama-bench, or DIR/llama-bench."""
    root = Path(root).expanduser()
    for base in (root, root.parent) if root.name == "bin" else (root,):
        if all((base / "bin" / t).is_file() for t in TARGETS):
            return LlamaCpp(base)
    if all((root / t).is_file() for t in TARGETS):
        raise BuildError(f"{root} holds the tools but not under bin/; point --llama-cpp at a directory with bin/llama-bench "
                         "and bin/llama-quantize")
    raise BuildError(f"{root} has no bin/llama-bench and bin/llama-quantize; point --llama-cpp at a llama.cpp build "
                     "directory, or leave it out to build them once under LAPLACE_HOME")


def missing_toolchain(which: Callable[[str], str | None] | None = None) -> list[str]:
    """What a build needs and this machine lacks: cmake, a C compiler, a C++ compiler."""
    which = which or shutil.which
    need = {"cmake": ("cmake",), "a C compiler (cc, gcc or clang)": ("cc", "gcc", "clang"),
            "a C++ compiler (c++, g++ or clang++)": ("c++", "g++", "clang++")}
    return [what for what, names in need.items() if not any(which(n) for n in names)]


def toolchain_error(missing: Sequence[str]) -> BuildError:
    return BuildError(f"building llama.cpp for the bench needs {' and '.join(missing)}, not found on PATH; install them "
                      "(Debian/Ubuntu: apt-get install cmake build-essential), or pass --llama-cpp DIR with a llama.cpp "
                      "build holding bin/llama-bench and bin/llama-quantize")


def ensure_llama_cpp(home: Path, *, jobs: int = 2, log: Log = lambda line: print(line, file=sys.stderr, flush=True),
                     which: Callable[[str], str | None] | None = None) -> LlamaCpp:
    """The tools under `home`, building them first if they are not there (once, under a lock)."""
    root = tools_dir(home)
    if is_complete(root):
        return LlamaCpp(root)
    missing = missing_toolchain(which)
    if missing:
        raise toolchain_error(missing)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"llama.cpp-{VERSION}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another laplace is building llama.cpp in {root.parent}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(root):  # built while we waited
            return LlamaCpp(root)
        scratch = root.parent / f".build-llama.cpp-{VERSION}"
        src = prepare_source(scratch, log)
        build = cmake_build(src, jobs, log)
        install(src, build, root)
        shutil.rmtree(scratch, ignore_errors=True)
    return LlamaCpp(root)


def prepare_source(scratch: Path, log: Log) -> Path:
    """vendor/llama.cpp from the pinned sdist, extracted under `scratch` (kept if already there)."""
    src = scratch / VENDOR
    marker = scratch / ".extracted"
    if marker.is_file() and (src / "CMakeLists.txt").is_file():
        return src
    sdist = fetch_sdist(scratch, log)
    extract_vendor(sdist, scratch)
    marker.write_text(SDIST_SHA256 + "\n")
    return src


def fetch_sdist(into: Path, log: Log) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    sdist = into / SDIST_NAME
    if not sdist.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={VERSION}", "-d", str(into)]
        log(f"fetching llama.cpp's source (once): {' '.join(cmd[2:])}")
        res = run_step(cmd, timeout=PIP_TIMEOUT_S, what="pip download of the llama-cpp-python sdist")
        if not sdist.is_file():
            raise BuildError(f"pip download did not produce {SDIST_NAME} ({last_line(res.stderr)}); check the network "
                             f"or put the file in {into} by hand")
    got = sha256_of(sdist)
    if got != SDIST_SHA256:
        sdist.unlink()
        raise BuildError(f"{SDIST_NAME} has sha256 {got}, not the pinned {SDIST_SHA256}; it was deleted; run again to "
                         "fetch it anew")
    return sdist


def extract_vendor(sdist: Path, into: Path) -> None:
    """Only vendor/llama.cpp/, with tarfile's "data" filter (no links out, no devices)."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar if m.name == VENDOR or m.name.startswith(VENDOR + "/")]
        if not any(m.name == f"{VENDOR}/CMakeLists.txt" for m in members):
            raise BuildError(f"{sdist} holds no {VENDOR}/CMakeLists.txt; it is not the expected sdist")
        tar.extractall(into, members=members, filter="data")


def cmake_build(src: Path, jobs: int, log: Log) -> Path:
    build = src / "build"
    log(f"building llama.cpp {VERSION} ({', '.join(TARGETS)}) once, with cmake, {jobs} jobs: several minutes")
    run_step(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], timeout=CONFIGURE_TIMEOUT_S, what="cmake configure")
    run_step(["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)], timeout=BUILD_TIMEOUT_S,
             what="cmake build")
    return build


def install(src: Path, build: Path, root: Path) -> None:
    """Copy the binaries and the converter into `root`, build.json last, via a rename."""
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "bin").mkdir(parents=True)
    for t in TARGETS:
        found = build / "bin" / t
        if not found.is_file():
            raise BuildError(f"cmake finished but {found} is missing; remove {src.parent.parent.parent} and run again")
        shutil.copy2(found, partial / "bin" / t)
    for part in CONVERTER_PARTS:
        s, d = src / part, partial / "converter" / part
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, ignore=shutil.ignore_patterns("__pycache__"))
        elif s.is_file():
            shutil.copy2(s, d)
    info = {"llama_cpp_python": VERSION, "sdist_sha256": SDIST_SHA256, "cmake_flags": list(CMAKE_FLAGS),
            "targets": list(TARGETS)}
    (partial / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    if root.exists():
        shutil.rmtree(root)
    partial.rename(root)


def run_step(cmd: Sequence[str], *, timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run one build step; a failure or a timeout is a BuildError with the output's last lines."""
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what} did not finish in {timeout:.0f} s; run again (a build resumes where it stopped)") from None
    except OSError as exc:
        raise BuildError(f"{what} could not start ({exc})") from None
    if res.returncode != 0:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-8:]) or "no output"
        raise BuildError(f"{what} failed (exit {res.returncode}):\n{tail}")
    return res


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"
