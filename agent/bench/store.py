"""Session store benchmark for `laplace bench`: commit cost by state size, resume cost by length.

Backs two promises: committing a turn costs about the state's write, and resume time does
not grow with the transcript (10 turns vs 10,000 should be about equal). No torch here:
states are random bytes of the real sizes, which is all the store ever sees.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from sessions import SessionStore, StateMeta

STATE_BYTES_3B = 29_491_200  # the 3B preset's recurrent state
STATE_BYTES_TINY = 2 * 4 * 16 * 64 * 4  # the tiny preset's (layers x heads x K x V x fp32)
_META = StateMeta(model_fingerprint="bench-fingerprint")


def _exchange(store: SessionStore, uid: str, state: bytes | None) -> float:
    """One user + assistant turn; returns the seconds spent in `commit_turn` alone."""
    store.turns.begin_turn(uid, role="user", content="benchmark question", token_ids=[1, 2, 3, 4])
    a = store.turns.begin_turn(uid, role="assistant")
    t0 = time.perf_counter()
    store.turns.commit_turn(a.id, content="benchmark answer", token_ids=[5, 6, 7, 8, 9], state=state,
                      state_meta=_META if state is not None else None)
    return time.perf_counter() - t0


def _commit_ms(store: SessionStore, size: int, reps: int) -> float:
    uid = store.turns.create_session(model_id="bench", system_token_ids=[0]).uid
    state = os.urandom(size)  # incompressible, like real float states
    _exchange(store, uid, state)  # warm-up: first write grows the file
    return statistics.median(_exchange(store, uid, state) for _ in range(reps)) * 1000


def _session_with_turns(store: SessionStore, turns: int, state_bytes: int) -> str:
    uid = store.turns.create_session(model_id="bench", system_token_ids=[0]).uid
    with store.core.transaction():  # bulk build: one fsync instead of `turns` of them
        for _ in range(turns // 2):
            _exchange(store, uid, None)
    head = store.tree.get_turn(store.core.get_session(uid).head_turn_id)
    store.states.put(head.id, os.urandom(state_bytes), _META)
    return uid


def _resume_ms(store: SessionStore, uid: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = store.states.resume(uid, tail=10, expected_fingerprint=_META.model_fingerprint)
        times.append(time.perf_counter() - t0)
        assert r.state is not None and r.tokens_to_fold == 0
    return statistics.median(times) * 1000


def run_store_bench(tmp_dir: Path, *, quick: bool = False, small_state_bytes: int = STATE_BYTES_TINY) -> dict[str, Any]:
    """Run the store benchmark in `tmp_dir` and return JSON-able results (times in ms)."""
    tmp_dir = Path(tmp_dir)
    reps = 3 if quick else 7
    long_turns = 1_000 if quick else 10_000
    results: dict[str, Any] = {"quick": quick}
    with SessionStore.open(tmp_dir / "bench-store.db") as store:
        results["commit_ms_3b_state"] = _commit_ms(store, STATE_BYTES_3B, reps)
        results["commit_ms_small_state"] = _commit_ms(store, small_state_bytes, reps)
        results["state_bytes_3b"] = STATE_BYTES_3B
        results["state_bytes_small"] = small_state_bytes
        short_uid = _session_with_turns(store, 10, small_state_bytes)
        long_uid = _session_with_turns(store, long_turns, small_state_bytes)
        short_ms = _resume_ms(store, short_uid, reps * 5)
        long_ms = _resume_ms(store, long_uid, reps * 5)
    results.update({
        "resume_turns_short": 10, "resume_turns_long": long_turns,
        "resume_ms_short": short_ms, "resume_ms_long": long_ms,
        "resume_ratio_long_over_short": long_ms / short_ms,
    })
    return results


if __name__ == "__main__":  # `python -m agent.bench.store` for a quick look without the CLI
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(run_store_bench(Path(d), quick="--quick" in sys.argv), indent=2))
