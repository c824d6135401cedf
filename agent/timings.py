"""Where a command's time goes: named phases, printed to stderr when the command ends.

`LAPLACE_TIMINGS=1 laplace ask -c "..."` breaks the first-token latency of a resumed
session into its parts (start-up, imports, model load, state load, hash chain, recall
refresh, prefill, first token). The CLI turns recording on (`enable`) when the settings
ask for it and prints the report when the command ends (`finish`); off, `phase` and
`mark` cost one check. Times are seconds since the process
started (read from /proc where there is one, else since this module was imported), so
the interpreter's own start-up and the imports before any phase are counted too.
Stdlib only: every layer may record phases without importing anything heavy.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, TextIO


def _process_start() -> float:
    """The process's start on the perf_counter clock (Linux: /proc/self/stat's start time,
    in clock ticks since boot, against CLOCK_BOOTTIME); elsewhere: now."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the whole line
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.perf_counter() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter()


@dataclass
class Phase:
    name: str
    start: float  # seconds since the process started
    seconds: float | None  # None: a point in time (`mark`)
    depth: int


class Recorder:
    """The phases of this process; records nothing until `enable` turns it on."""

    def __init__(self) -> None:
        self.on = False
        self.origin = 0.0
        self.phases: list[Phase] = []
        self._depth = 0

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def report(self) -> str:
        lines = ["timings (seconds; 'at' counts from the process start):"]
        for p in self.phases:
            label = "  " * p.depth + p.name
            if p.seconds is None:
                lines.append(f"  {label:<44} at {p.start:6.3f}")
            else:
                lines.append(f"  {label:<44} {p.seconds:6.3f}  (at {p.start:6.3f})")
        lines.append(f"  {'total':<44} at {self.now():6.3f}")
        return "\n".join(lines)


# A long-running command (a server, a TUI session) records its start-up and then stops
# adding phases, so recording never grows without bound.
MAX_PHASES = 200

_recorder = Recorder()  # one per process: the CLI switches it on, any layer records into it


def enable(imported_at: float | None = None) -> Recorder:
    """Start recording (the CLI does, for LAPLACE_TIMINGS=1). `imported_at`: when the CLI's
    imports ended (perf_counter), so the start-up splits into the interpreter with those
    imports, and the command line's parsing up to now."""
    rec = _recorder
    if not rec.on:
        rec.on, rec.origin, rec.phases, rec._depth = True, _process_start(), [], 0
        now = rec.now()
        split = None if imported_at is None else imported_at - rec.origin
        if split is None or not 0 <= split <= now:
            rec.phases.append(Phase("start-up (interpreter, laplace's CLI imports)", 0.0, now, 0))
        else:
            rec.phases.append(Phase("start-up: interpreter and laplace's CLI imports", 0.0, split, 0))
            rec.phases.append(Phase("start-up: command line parsed (typer)", split, now - split, 0))
    return rec


def finish(stream: TextIO | None = None) -> None:
    """Print the report to `stream` (stderr), after what the command printed, and stop
    recording; nothing when recording is off."""
    rec = _recorder
    if not rec.on:
        return
    sys.stdout.flush()
    print(rec.report(), file=stream or sys.stderr, flush=True)
    rec.on, rec.phases = False, []


def enabled() -> bool:
    return _recorder.on


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as `name` (nested phases are indented under it)."""
    rec = _recorder
    if not rec.on or len(rec.phases) >= MAX_PHASES:
        yield
        return
    entry = Phase(name, rec.now(), None, rec._depth)
    rec.phases.append(entry)
    rec._depth += 1
    try:
        yield
    finally:
        rec._depth -= 1
        entry.seconds = rec.now() - entry.start


def mark(name: str, *, once: bool = True) -> None:
    """Record the moment `name` happened (with `once`, only its first time)."""
    rec = _recorder
    if not rec.on or len(rec.phases) >= MAX_PHASES or (once and any(p.name == name and p.seconds is None for p in rec.phases)):
        return
    rec.phases.append(Phase(name, rec.now(), None, rec._depth))
