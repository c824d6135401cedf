"""The scheduler's batching: prompts fold a segment at a time between decode steps, and a
compiled runner never compiles after warm-up whatever mix of requests arrives."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from agent.serve.compiling import compiled_runner

from .conftest import running


def test_a_long_prompt_is_read_a_segment_at_a_time_between_decode_steps(db, endless, monkeypatch):
    with running(db, endless, segment_len=32) as server:
        runner, log = server.writer.runner, []
        real_prefill, real_step = runner.prefill, runner.step_
        monkeypatch.setattr(runner, "prefill", lambda ids, state=None, progress=None: (
            log.append(("prefill", len(ids))), real_prefill(ids, state, progress))[1])
        monkeypatch.setattr(runner, "step_", lambda tokens, state: (log.append(("step", 0)), real_step(tokens, state))[1])
        body = {"model": "tiny", "temperature": 0, "max_tokens": 3000, "stream": True,
                "messages": [{"role": "user", "content": "keep going"}]}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", server.base + "/chat/completions", json=body) as r:
                lines = r.iter_lines()
                for _ in range(5):
                    next(lines)
                log.clear()
                long = httpx.post(server.base + "/chat/completions", timeout=120, json={
                    "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 400}]})
                assert long.status_code == 200
        folds = [i for i, (kind, _) in enumerate(log) if kind == "prefill"]
        assert len(folds) > 2000 // 32  # the 2,000-character prompt, a segment (or less) at a time
        assert all(n <= 32 for kind, n in log if kind == "prefill")
        # Between consecutive segments of the long prompt, the running reply stepped.
        first, last = folds[0], folds[-1]
        gaps = [log[a + 1:b] for a, b in zip(folds, folds[1:]) if a >= first and b <= last]
        assert sum(1 for g in gaps if any(kind == "step" for kind, _ in g)) >= len(gaps) - 2


@pytest.mark.parametrize("model", ["lm", "window"])
def test_no_compile_after_warm_up(db, model, request):
    """Whatever mix of requests arrives, new sessions and continued ones (whose state left a
    batch), on the GLA model and on the window hybrid (whose `pos` is all size-1 dims)."""
    lm = request.getfixturevalue(model)
    torch._dynamo.reset()
    runner, log = compiled_runner(lm.model, widths=(1, 2, 4, 8), backend="eager", segment_len=32)
    runner.warm_up()
    log.warm = True
    warmed = log.summary()["compiles"]
    assert warmed == len(runner.batch_widths) + len(runner.segment_buckets) and log.after_warmup == 0
    with running(db, lm, runner=runner, widths=(1, 2, 4, 8)) as server:
        sessions: list[str] = []

        def ask(i):
            body = {"model": "tiny", "max_tokens": 3 + 5 * (i % 4), "seed": i,
                    "messages": [{"role": "user", "content": "q" * (1 + 37 * i)}]}
            if sessions and i % 2:
                body["session"] = sessions.pop()
            r = httpx.post(server.base + "/chat/completions", timeout=120, json=body)
            assert r.status_code == 200, r.text
            sessions.append(r.json()["session"])

        for wave in (3, 7, 1, 5):  # arrivals that make every width from 1 to 8 and back
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(wave)]
            for t in threads:
                t.start()
                time.sleep(0.01)
            for t in threads:
                t.join()
        stats = httpx.get(server.base + "/laplace/stats").json()
    assert log.after_warmup == 0 and log.summary()["compiles"] == warmed
    assert len(stats["rows_histogram"]) >= 3  # many batch sizes seen; padded to a few widths
    assert set(stats["width_histogram"]) <= {"1", "2", "4", "8"}
