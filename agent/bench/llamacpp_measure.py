"""One measurement of one runtime on one model: a child process, its speeds, its peak RSS.

Both sides run the same protocol (`Protocol`): `depth` tokens read first (untimed), then
`prompt` more tokens timed as prefill, and, from a fresh state of `depth` tokens, `gen`
tokens decoded one at a time, timed as decode. That is what `llama-bench -p P -n N -d D`
measures (its "pp P @ dD" and "tg N @ dD" tests), so the laplace child does the same. The
llama-bench vendored in llama-cpp-python 0.3.36 has `-d/--n-depth`; for a recurrent model
(Mamba-2) it reads the depth the same way, so both kinds of rows use one protocol.

Peak RSS is each child's VmHWM, read from /proc/PID/status while it runs (it only grows, so
the last reading is the peak to within the polling interval). `ru_maxrss` would not do: Linux
keeps the pre-exec high-water mark across fork/vfork and exec, so a child of this process
would start at the parent's peak. The laplace child also reports its own VmHWM at its end.

Every child runs under a timeout; `others_cpu_share` says how much of the machine other
processes took meanwhile (from /proc/stat, less this process's children's CPU time).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

CHILD_TIMEOUT_S = 1800.0  # one child: a model load plus one round of the protocol
POLL_S = 0.02


class MeasureError(Exception):
    """A child failed, hung or printed something other than its result."""


@dataclass(frozen=True)
class Protocol:
    """What each child measures; `llama-bench -t threads -p prompt -n gen -d depth -r 1`."""

    threads: int = 2
    prompt: int = 512
    gen: int = 128
    depth: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("threads", "prompt", "gen"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.depth < 0:
            raise ValueError(f"depth must be 0 or more, got {self.depth}")


@dataclass(frozen=True)
class Measurement:
    """One child's result: tokens per second and peak RSS in MiB."""

    prefill_tok_s: float
    decode_tok_s: float
    peak_rss_MB: float
    others_cpu_share: float = 0.0

    def to_json(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class ChildRun:
    stdout: str
    stderr: str
    peak_kb: int
    others_cpu_share: float


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    env.pop("LAPLACE_DTYPE", None)  # the laplace child is told its weights explicitly
    return env


def run_child(cmd: Sequence[str], *, env: dict[str, str], timeout: float = CHILD_TIMEOUT_S, what: str) -> ChildRun:
    """Run `cmd`, polling its VmHWM; a nonzero exit or a timeout is a MeasureError."""
    before = cpu_counters()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env, text=True)
        except OSError as exc:
            raise MeasureError(f"{what} could not start ({exc})") from None
        try:
            peak = poll_peak_kb(proc, timeout)
        except BaseException:  # Ctrl-C or any error here: the child must not outlive the bench
            proc.kill()
            proc.wait()
            raise
        if peak is None:
            raise MeasureError(f"{what} ran past {timeout:.0f} s and was stopped")
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-6:]) or "no output"
        raise MeasureError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return ChildRun(stdout, stderr, peak, others_cpu_share(before, cpu_counters()))


def poll_peak_kb(proc: subprocess.Popen[str], timeout: float) -> int | None:
    """The child's last VmHWM before it exits, or None (and the child killed) at the timeout."""
    deadline = time.monotonic() + timeout
    peak = 0
    while proc.poll() is None:
        peak = max(peak, read_hwm_kb(proc.pid))
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return None
        time.sleep(POLL_S)
    return peak


def read_hwm_kb(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):  # exited meanwhile, or not Linux
        pass
    return 0


def cpu_counters() -> tuple[float, float, float]:
    """(wall s, CPU-seconds busy on the whole machine, CPU-seconds of this process's waited children)."""
    busy = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), busy, ru.ru_utime + ru.ru_stime


def others_cpu_share(before: tuple[float, float, float], after: tuple[float, float, float],
                     cpus: int | None = None) -> float:
    """Share of the machine's CPU time that other processes used while a child ran (0: it
    had the machine to itself; 0.5 on 2 CPUs: one core's worth of someone else's work)."""
    wall, busy, ours = (a - b for a, b in zip(after, before))
    return max(0.0, (busy - ours) / (wall * (cpus or os.cpu_count() or 1))) if wall > 0 else 0.0


# ---------------------------------------------------------------------------- llama.cpp


def llama_bench_command(bench: Path, gguf: Path, p: Protocol) -> list[str]:
    """One round: `-r 1` (the rounds alternate with laplace's, each a fresh process)."""
    return [str(bench), "-m", str(gguf), "-t", str(p.threads), "-p", str(p.prompt), "-n", str(p.gen),
            "-d", str(p.depth), "-r", "1", "-o", "json"]


def parse_llama_bench(stdout: str, p: Protocol) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) from `llama-bench -o json`: its pp and tg tests at our depth."""
    try:
        tests = json.loads(stdout[stdout.index("["):])
    except ValueError:
        raise MeasureError(f"llama-bench printed no JSON results: {stdout.strip()[:200]!r}") from None
    speeds: dict[str, float] = {}
    for t in tests:
        if t.get("n_depth", 0) != p.depth:
            continue
        if t.get("n_prompt") == p.prompt and t.get("n_gen") == 0:
            speeds["prefill"] = float(t["avg_ts"])
        elif t.get("n_gen") == p.gen and t.get("n_prompt") == 0:
            speeds["decode"] = float(t["avg_ts"])
    if set(speeds) != {"prefill", "decode"}:
        raise MeasureError(f"llama-bench's JSON lacks the pp{p.prompt} / tg{p.gen} @ d{p.depth} tests")
    return speeds["prefill"], speeds["decode"]


def measure_llama_cpp(bench: Path, gguf: Path, p: Protocol, *, timeout: float = CHILD_TIMEOUT_S) -> Measurement:
    run = run_child(llama_bench_command(bench, gguf, p), env=child_env(p.threads), timeout=timeout,
                    what=f"llama-bench on {gguf.name}")
    prefill, decode = parse_llama_bench(run.stdout, p)
    return Measurement(prefill, decode, run.peak_kb / 1024, run.others_cpu_share)


# ---------------------------------------------------------------------------- laplace


def laplace_command(model_dir: Path, weights: str, p: Protocol, engine: str = "torch") -> list[str]:
    spec = {"model": str(model_dir), "weights": weights, "engine": engine, **asdict(p)}
    return [sys.executable, "-m", "agent.bench.laplace_child", json.dumps(spec)]


def parse_laplace_child(stdout: str, p: Protocol) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1])
        float(res["prefill_s"]), float(res["decode_s"]), int(res["peak_kb"])
    except (IndexError, ValueError, KeyError, TypeError):
        raise MeasureError(f"the laplace child printed no result: {stdout.strip()[-200:]!r}") from None
    return res


def measure_laplace(model_dir: Path, weights: str, p: Protocol, *, engine: str = "torch",
                    timeout: float = CHILD_TIMEOUT_S) -> Measurement:
    run = run_child(laplace_command(model_dir, weights, p, engine), env=child_env(p.threads), timeout=timeout,
                    what=f"laplace {'' if engine == 'torch' else engine + ' '}{weights} on {Path(model_dir).name}")
    res = parse_laplace_child(run.stdout, p)
    peak_kb = max(run.peak_kb, int(res["peak_kb"]))
    return Measurement(p.prompt / res["prefill_s"], p.gen / res["decode_s"], peak_kb / 1024, run.others_cpu_share)
