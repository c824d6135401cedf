"""The serving pilot's load generator: seeded request mixes, Poisson arrivals, SSE timing.

Every request streams, so the client sees what a user sees: time to the first content
chunk, the gaps between chunks, the end. Arrivals are a Poisson process (exponential gaps,
seeded) for a fixed time, with a hard cap on the count; a phase then waits for what it
sent, up to a deadline, so a phase is bounded in count and in time whatever the server does.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from agent.recall.smalltalk import chat_exchange, sentence

PROMPT_MIX = (("short", 0.6, 2), ("medium", 0.3, 12), ("long", 0.1, 60))  # name, share, sentences
MAX_TOKENS = (16, 32, 64)
CONTINUE_SHARE = 0.3


@dataclass
class Outcome:
    """One request as the client saw it (times in seconds from its send)."""

    kind: str
    status: int = 0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    total: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish: str | None = None
    queue_s: float | None = None
    session: str | None = None
    text: str = ""
    error: str | None = None
    sent_at: float = 0.0
    done_at: float = 0.0


def make_request(rng: random.Random, index: int, sessions: list[str], model: str) -> tuple[str, dict[str, Any]]:
    """(prompt kind, body): a seeded mix of prompt lengths and reply lengths; a share of
    the requests continue an idle session from earlier in the run."""
    roll, acc, kind, n = rng.random(), 0.0, "short", 2
    for kind, share, n in PROMPT_MIX:
        acc += share
        if roll < acc:
            break
    text = " ".join(sentence(rng) for _ in range(n))
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice(MAX_TOKENS), "temperature": 0.8, "seed": index,
                            "stream": True, "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": text}]}
    if sessions and rng.random() < CONTINUE_SHARE:
        body["session"] = sessions.pop(rng.randrange(len(sessions)))
        kind += "+session"
    return kind, body


async def stream_one(http: httpx.AsyncClient, body: dict[str, Any], kind: str = "") -> Outcome:
    out = Outcome(kind=kind, sent_at=time.monotonic())
    t0 = out.sent_at
    last = None
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            out.status = r.status_code
            out.session = r.headers.get("x-laplace-session")
            if r.status_code != 200:
                out.error = (await r.aread()).decode("utf-8", "replace")[:300]
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"]["message"]
                    continue
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
                    out.prompt_tokens = chunk["usage"]["prompt_tokens"]
                for choice in chunk.get("choices", []):
                    piece = choice["delta"].get("content")
                    if piece:
                        now = time.monotonic()
                        if out.ttft is None:
                            out.ttft = now - t0
                        elif last is not None:
                            out.gaps.append(now - last)
                        last = now
                        out.text += piece
                    if choice.get("finish_reason"):
                        out.finish = choice["finish_reason"]
                if chunk.get("laplace"):
                    out.queue_s = chunk["laplace"]["timings"]["queue_s"]
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.done_at = time.monotonic()
        out.total = out.done_at - t0
    return out


async def poisson_phase(http: httpx.AsyncClient, *, rate: float, duration: float, rng: random.Random, model: str,
                        sessions: list[str], start_index: int, max_requests: int, deadline_s: float,
                        extra: list[Any] | None = None) -> tuple[list[Outcome], float, list[Any]]:
    """Send requests at Poisson times for `duration` s (at most `max_requests`); wait for them
    up to `deadline_s` after the last send. `extra` coroutines (recall probes) run alongside.
    Returns the outcomes, the phase's wall time (first send to last completion) and what the
    extra coroutines returned (None for one that did not finish in time)."""
    tasks: list[asyncio.Task[Outcome]] = []
    t0 = time.monotonic()
    side = [asyncio.ensure_future(c) for c in (extra or [])]
    index = start_index
    while time.monotonic() - t0 < duration and len(tasks) < max_requests:
        kind, body = make_request(rng, index, sessions, model)
        index += 1

        async def one(body: dict[str, Any] = body, kind: str = kind) -> Outcome:
            out = await stream_one(http, body, kind)
            if out.status == 200 and out.session:
                sessions.append(out.session)  # idle again: later requests may continue it
            return out

        tasks.append(asyncio.ensure_future(one()))
        await asyncio.sleep(rng.expovariate(rate))
    done, pending = await asyncio.wait([*tasks, *side], timeout=deadline_s) if tasks or side else (set(), set())
    for task in pending:
        task.cancel()
    outcomes = [t.result() for t in tasks if t in done and not t.cancelled()]
    wall = max((o.done_at for o in outcomes), default=t0) - t0
    return outcomes, wall, [t.result() if t in done and not t.cancelled() else None for t in side]


async def closed_loop(http: httpx.AsyncClient, *, clients: int, duration: float, rng: random.Random, model: str,
                      sessions: list[str], start_index: int, deadline_s: float) -> tuple[list[Outcome], float]:
    """`clients` users each sending their next request as soon as the last one ends, for
    `duration` s: the most the server can do at that concurrency (the baseline is clients=1)."""
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    counter = iter(range(start_index, start_index + 100_000))

    async def user() -> None:
        while time.monotonic() - t0 < duration:
            kind, body = make_request(rng, next(counter), sessions, model)
            out = await stream_one(http, body, kind)
            if out.status == 200 and out.session:
                sessions.append(out.session)
            outcomes.append(out)

    tasks = [asyncio.ensure_future(user()) for _ in range(clients)]
    _, pending = await asyncio.wait(tasks, timeout=duration + deadline_s)
    for task in pending:
        task.cancel()
    return outcomes, max((o.done_at for o in outcomes), default=t0) - t0


async def sequential(http: httpx.AsyncClient, *, count: int, rng: random.Random, model: str, sessions: list[str],
                     start_index: int, deadline_s: float) -> tuple[list[Outcome], float]:
    """The baseline: the same kind of requests, one at a time."""
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    for i in range(count):
        if time.monotonic() - t0 > deadline_s:
            break
        kind, body = make_request(rng, start_index + i, sessions, model)
        out = await stream_one(http, body, kind)
        if out.status == 200 and out.session:
            sessions.append(out.session)
        outcomes.append(out)
    return outcomes, time.monotonic() - t0


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99)}


def summarize(name: str, outcomes: list[Outcome], wall: float, rate: float | None) -> dict[str, Any]:
    """One row of the report: throughput and latencies (ms) of a phase, flat.

    ttft: send to the first content chunk. itl: the gaps between content chunks as they
    arrived (chunks that arrive in one read show as ~0). tpot: per request, the time from
    the first to the last chunk over the tokens after the first (vLLM's time per output
    token), which does not depend on how the network grouped the chunks. queue: the
    server's wait before the request got a batch row."""
    ok = [o for o in outcomes if o.status == 200 and o.error is None]
    tokens = sum(o.completion_tokens for o in ok)
    queue = [o.queue_s for o in ok if o.queue_s is not None]
    tpot = [(sum(o.gaps)) / (o.completion_tokens - 1) for o in ok if o.completion_tokens > 1 and o.gaps]
    row: dict[str, Any] = {
        "phase": name, "rate_rps": rate, "requests": len(outcomes), "ok": len(ok),
        "errors": len(outcomes) - len(ok), "refused": sum(1 for o in outcomes if 400 <= o.status < 500),
        "completion_tokens": tokens, "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else 0.0,
    }
    for key, values in (("ttft", [o.ttft for o in ok if o.ttft is not None]), ("itl", [g for o in ok for g in o.gaps]),
                        ("tpot", tpot), ("queue", queue)):
        for q, v in percentiles(values).items():
            row[f"{key}_{q}_ms"] = v
    row["continued_sessions"] = sum(1 for o in ok if o.kind.endswith("+session"))
    return row


# ---- recall probes -------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    key: str
    value: str
    plant: list[dict[str, str]]
    question: str


def make_probes(n: int, seed: int, filler_exchanges: int = 3) -> list[Probe]:
    """A fact, small talk after it, then (in a second request, on the stored session) the question."""
    from agent.probes import text

    rng = random.Random(seed)
    probes = []
    for _ in range(n):
        key, value = text.make_key(rng), text.make_value(rng, "digits")
        messages = [{"role": "user", "content": f"The code for the {key} is {value}."},
                    {"role": "assistant", "content": "Noted."}]
        for _ in range(filler_exchanges):
            user, reply = chat_exchange(rng)
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        user, _ = chat_exchange(rng)
        messages.append({"role": "user", "content": user})
        probes.append(Probe(key, value, messages, f"What is the code for the {key}?"))
    return probes


async def ask_probe(http: httpx.AsyncClient, probe: Probe, model: str, delay: float = 0.0) -> dict[str, Any]:
    """Plant (a plain request: the conversation folded as turns), then ask on the session, greedy."""
    await asyncio.sleep(delay)
    planted = await stream_one(http, {"model": model, "messages": probe.plant, "max_tokens": 16, "temperature": 0,
                                      "stream": True}, "probe")
    if planted.status != 200 or not planted.session:
        return {"key": probe.key, "value": probe.value, "answer": None, "correct": False, "error": planted.error}
    asked = await stream_one(http, {"model": model, "session": planted.session, "max_tokens": 24, "temperature": 0,
                                    "stream": True, "messages": [{"role": "user", "content": probe.question}]}, "probe")
    return {"key": probe.key, "value": probe.value, "answer": asked.text, "correct": probe.value in asked.text,
            "error": asked.error}


def outcome_dicts(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(o).items() if k not in ("text", "gaps")} | {"gaps_n": len(o.gaps)}
            for o in outcomes]
