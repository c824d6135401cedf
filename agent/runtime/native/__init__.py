"""Small C kernels for batch-1 decode, built on first use with the machine's C compiler.

A decode step of the default model ran ~360 torch ops per layer for the window mixer
alone; at a few microseconds each the dispatch cost more than the layer's arithmetic (issue
35). `decode.c` does all of a step but its matmuls in three kinds of call (`decode.py`
runs a whole step through them; `window_decode.py` the window mixer's part alone). It is built once per source,
compiler and CPU (`-march=native`) into a cache directory and loaded with ctypes; the
torch step in `window_decode.py` stays the reference it is tested against, and the
fallback wherever the kernel cannot run:

- no C compiler (`cc`, or $CC), a failed build or load: the torch step, and `status()` says why;
- LAPLACE_NATIVE=0 turns the kernels off (for a comparison, or a suspected kernel bug).

The cache is $LAPLACE_NATIVE_CACHE, else $XDG_CACHE_HOME/laplace/native, else
~/.cache/laplace/native. A build writes a temporary file and renames it into place, so
two processes building at once each load a whole library, and keeps its sha256 beside it:
a library that no longer matches it (truncated, damaged) is built again, never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("decode.c")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fPIC", "-shared", "-std=gnu11", "-pthread")
BUILD_TIMEOUT_S = 120

_lib: ctypes.CDLL | None = None
_status = "not loaded yet"
_tried = False

_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
# Each kernel's parameters, in order (see decode.c).
_L = ctypes.c_int64
WINDOW_ARGS = (
    _P, _I, _P, _L, _P, _P,  # qkv, io_bf16, qkv_scale, qkv_stride, win_k, win_v
    _P, _P, _P, _P,  # cos3, sin3, row, bias (whole tables)
    _L, _I, _I, _I, _I, _I, _I,  # t0, T, H, G, D, S, W
    _P, _P, _L, _I, _P, _P,  # gla, xin, xin_stride, d_model, decay_w, decay_b
    _P, _P, _I, _F, _P,  # q_map, k_map, F0, gate_normalizer, mix
    _F, _I, _F, _P, _L, _I,  # scale, gated, eps, y, y_stride, threads
)
# laplace_window_memory: laplace_window's, then the memory's (the engine's "novelty" memory):
# mem_k, mem_v, mem_score, mem_pos, M, mem_tab, span, twin_cut.
WINDOW_MEMORY_ARGS = WINDOW_ARGS + (_P, _P, _P, _P, _I, _P, _I, _F)
ADD_NORM_ARGS = (_P, _P, _I, _P, _I, _P, _F, _P, _P, _I)  # x, y, y_bf16, y_scale, n, w, eps, out_f, out, out_bf16
SILU_MUL_ARGS = (_P, _I, _P, _I, _P, _I)  # gu, gu_bf16, gu_scale, n, out, out_bf16
MATMUL_I8_ARGS = (_P, _L, _I, _P, _P, _I, _P, _L, _I)  # x, T, K, w, scale, N, out, out_stride, threads
KERNELS = {"laplace_window": WINDOW_ARGS, "laplace_window_memory": WINDOW_MEMORY_ARGS,
           "laplace_add_norm": ADD_NORM_ARGS, "laplace_silu_mul": SILU_MUL_ARGS,
           "laplace_matmul_i8": MATMUL_I8_ARGS, "laplace_matmul_i8_vnni": (),
           "laplace_add_norm_rows": (_P, _P, _L, _I, _P, _F, _P),  # x, y, T, n, w, eps, out
           "laplace_silu_mul_rows": (_P, _L, _I, _P)}  # gu, T, n, out


def cache_dir() -> Path:
    if os.environ.get("LAPLACE_NATIVE_CACHE"):
        return Path(os.environ["LAPLACE_NATIVE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "laplace" / "native"


def _cpu_flags() -> str:
    """The CPU's feature flags: -march=native code is only good on the CPU it was built for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def library_path(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), cc, version, " ".join(FLAGS), _cpu_flags()]).encode()).hexdigest()
    return cache_dir() / f"decode-{key[:16]}.so"


def _private(path: Path) -> bool:
    """Whether `path` is this user's and no one else can write it: a library loaded from a
    directory another user can write could be theirs (LAPLACE_NATIVE_CACHE=/tmp/x, say)."""
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _intact(lib: Path) -> bool:
    """Whether `lib` is the file its build wrote (its sha256 beside it): a truncated or damaged
    library is not merely refused by dlopen, it can crash the process (SIGBUS)."""
    try:
        return _digest_path(lib).read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    except OSError:
        return False


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(cc: str, out: Path) -> None:
    """Compiles SOURCE into `out`, then its sha256 beside it (each a temporary file renamed
    into place: two processes building at once each leave a whole file)."""
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{cc} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        os.replace(tmp, out)
        _write_atomic(_digest_path(out), digest.encode())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built first if need be; None (and `status()` says why) where they cannot be."""
    global _lib, _status, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("LAPLACE_NATIVE", "1").strip() in ("0", "off", "false", "no"):
        _status = "off (LAPLACE_NATIVE=0)"
        return None
    cc = _compiler()
    if cc is None:
        _status = "off: no C compiler (cc or $CC) on PATH; the torch step runs instead"
        return None
    try:
        path = library_path(cc)
        if not _intact(path):  # never built, or damaged since: built (again)
            build(cc, path)
        if not (_private(path.parent) and _private(path)):
            _status = f"off: {path.parent} or the library in it is not private to this user; the torch step runs instead"
            return None
        lib = ctypes.CDLL(str(path))
        for name, argtypes in KERNELS.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int if name in ("laplace_window", "laplace_window_memory", "laplace_matmul_i8_vnni") else None
    except (OSError, subprocess.SubprocessError) as e:
        _status = f"off: the kernel did not build or load ({e}); the torch step runs instead"
        return None
    _lib, _status = lib, f"on ({path.name})"
    return _lib


def status() -> str:
    """One line: whether the C kernels run, and if not, why."""
    library()
    return _status


def reset() -> None:
    """Forget the loaded library (tests switch LAPLACE_NATIVE between runs)."""
    global _lib, _status, _tried
    _lib, _status, _tried = None, "not loaded yet", False
