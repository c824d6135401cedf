"""`laplace bench serve`: the serving pilot the Laplace 3B report asks for, in one run.

It starts `laplace serve` (a real process, a fresh data directory, compiled over fixed
widths) and drives it over HTTP: a warm-up, the baseline (the same mix of requests one at a
time), then Poisson arrivals at several rates (mixed prompt lengths and reply lengths, a
share continuing stored sessions), with recall probes planted and asked through the server
during the busiest phase and again on the idle server, and last closed loops of 1, 4 and 16
users (`users`) each sending their next request as soon as the last one ends: what each
user sees (TTFT, ITL) and what the server does (completion tokens/s) as users are added,
and what one more user costs (the ITL p50 and tokens/s each added user changes), against
one request at a time in the same run. Then, with the server stopped, the
turns it served are replayed through an eager and a compiled runner in this process to
measure the largest logit difference. One report: throughput, time to first token and
inter-token latency p50/p95/p99, queue wait, the batch-width histogram and padding waste,
compile events (and compiles after warm-up, which must be 0), the logit difference, recall
under load vs idle; written as report.md, report.json and PNGs.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent.bench import loadgen

ROOT = Path(__file__).resolve().parents[2]  # what the server process imports: this same code
LOG_LINES = 200  # the server's last stderr lines kept (the report's `server_log`)


@dataclass(frozen=True)
class PilotConfig:
    model: str = "tiny"
    rates: tuple[float, ...] = (4.0, 8.0, 16.0)
    duration_s: float = 12.0
    baseline_requests: int = 16
    probes: int = 6
    widths: tuple[int, ...] = (1, 2, 4, 8, 16)
    compile_backend: str = "eager"  # eager: Dynamo capture, counted, no codegen; inductor; none
    seed: int = 0
    phase_deadline_s: float = 120.0
    max_requests_per_phase: int = 400
    replay_sessions: int = 8
    dtype: str = "float32"  # LAPLACE_DTYPE for the server, and the replay's dtype
    users: tuple[int, ...] = (1, 4, 16)  # closed-loop phases: this many users back to back
    max_queue: int = 1000  # the server's --max-queue (its default, 64, would turn the rate phases into 429s)
    max_tokens: int = 4096  # the server's --max-tokens
    max_prompt_tokens: int = 8192  # the server's --max-prompt-tokens

    @classmethod
    def quick(cls, **kw: Any) -> "PilotConfig":
        base = dict(rates=(8.0,), duration_s=5.0, baseline_requests=4, probes=2, phase_deadline_s=60.0,
                    max_requests_per_phase=60, replay_sessions=4)
        return cls(**{**base, **kw})


def _resolve(spec: str, models_dir: Path | None) -> str:
    """A name the server process (with its own empty data directory) can load: a path for a
    model directory, the name for a preset."""
    from agent.runtime.checkpoint import PACKAGED_MODELS, resolve_model_path

    path = resolve_model_path(spec, models_dir)
    if path is None or path.parent.resolve() == PACKAGED_MODELS.resolve():
        return spec  # a preset, or a model the package ships: the server finds it by name
    return str(path.resolve())


class ServerProcess:
    """`laplace serve` in a child process on a free loopback port."""

    def __init__(self, home: Path, model: str, cfg: PilotConfig) -> None:
        self.home = home
        args = ["serve", "-m", model, "--port", "0", "--widths", ",".join(map(str, cfg.widths)),
                "--max-queue", str(cfg.max_queue), "--max-tokens", str(cfg.max_tokens),
                "--max-prompt-tokens", str(cfg.max_prompt_tokens)]
        if cfg.compile_backend != "none":
            args += ["--compile", "--compile-backend", cfg.compile_backend]
        env = {**os.environ, "LAPLACE_HOME": str(home), "LAPLACE_DTYPE": cfg.dtype, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "PYTHONUNBUFFERED": "1"}
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", "from agent.cli import main; main()", *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.url = self._wait()
        self.startup_s = time.monotonic() - self.t0
        # Keep reading its stderr (the server logs errors there): a full pipe would block it.
        threading.Thread(target=self._drain, name="pilot-server-log", daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            del self.log[:-LOG_LINES]

    def _wait(self, timeout: float = 900.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            self.log.append(line.rstrip())
            match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            if match:
                url = match.group(1)
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(url + "/health", timeout=5).status_code == 200:
                            return url
                    except httpx.TransportError:
                        time.sleep(0.1)
        self.stop()
        raise RuntimeError("laplace serve did not start:\n" + "\n".join(self.log[-20:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _diff_stats(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A phase's own decode counters: the server's cumulative ones, after minus before."""
    out: dict[str, Any] = {}
    for key in ("width_histogram", "rows_histogram"):
        a, b = after.get(key, {}), before.get(key, {})
        out[key] = {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0)}
    steps = sum(int(w) * n for w, n in out["width_histogram"].items())
    rows = sum(int(r) * n for r, n in out["rows_histogram"].items())
    out["decode_steps"] = sum(out["width_histogram"].values())
    out["padding_waste"] = round(1 - rows / steps, 4) if steps else 0.0
    return out


def _phase(row: dict[str, Any], counters: dict[str, Any], details: dict[str, Any]) -> dict[str, Any]:
    """The row gets the scalar counters; the histograms go to the phase's details."""
    details[row["phase"]] = {k: counters[k] for k in ("width_histogram", "rows_histogram")}
    return row | {"decode_steps": counters["decode_steps"], "padding_waste": counters["padding_waste"]}


async def _drive(url: str, cfg: PilotConfig, model: str) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    sessions: list[str] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(cfg.phase_deadline_s), limits=limits) as http:
        async def stats() -> dict[str, Any]:
            return (await http.get("/v1/laplace/stats")).json()

        await loadgen.sequential(http, count=2, rng=random.Random(cfg.seed + 99), model=model, sessions=[],
                                 start_index=10_000, deadline_s=cfg.phase_deadline_s)  # warm-up, not reported
        rows: list[dict[str, Any]] = []
        raw: dict[str, Any] = {}
        details: dict[str, Any] = {}
        before = await stats()
        outcomes, wall = await loadgen.sequential(http, count=cfg.baseline_requests, rng=rng, model=model,
                                                  sessions=sessions, start_index=0, deadline_s=cfg.phase_deadline_s)
        rows.append(_phase(loadgen.summarize("one at a time", outcomes, wall, None), _diff_stats(before, await stats()),
                           details))
        raw["baseline"] = loadgen.outcome_dicts(outcomes)
        probes = loadgen.make_probes(cfg.probes, cfg.seed)
        loaded: list[Any] = []
        for i, rate in enumerate(cfg.rates):
            busiest = i == len(cfg.rates) - 1  # the probes are asked under the heaviest load
            extra = [loadgen.ask_probe(http, p, model, delay=cfg.duration_s * (j + 0.5) / len(probes))
                     for j, p in enumerate(probes)] if busiest else []
            before = await stats()
            outcomes, wall, side = await loadgen.poisson_phase(
                http, rate=rate, duration=cfg.duration_s, rng=rng, model=model, sessions=sessions,
                start_index=1000 * (i + 1), max_requests=cfg.max_requests_per_phase, deadline_s=cfg.phase_deadline_s,
                extra=extra)
            rows.append(_phase(loadgen.summarize(f"poisson {rate:g}/s", outcomes, wall, rate),
                               _diff_stats(before, await stats()), details))
            raw[f"rate_{rate:g}"] = loadgen.outcome_dicts(outcomes)
            if busiest:
                loaded = side
        for j, clients in enumerate(cfg.users):
            before = await stats()
            outcomes, wall = await loadgen.closed_loop(http, clients=clients, duration=cfg.duration_s, rng=rng,
                                                       model=model, sessions=sessions, start_index=100_000 * (j + 1),
                                                       deadline_s=cfg.phase_deadline_s)
            name = f"{clients} user{'s' if clients > 1 else ''} back to back"
            rows.append(_phase(loadgen.summarize(name, outcomes, wall, None) | {"users": clients},
                               _diff_stats(before, await stats()), details))
            raw[f"users_{clients}"] = loadgen.outcome_dicts(outcomes)
        idle = [await loadgen.ask_probe(http, p, model) for p in probes]
        final = await stats()
    return {"rows": rows, "raw": raw, "details": details, "recall_loaded": loaded, "recall_idle": idle, "server": final}


def _recall(loaded: list[Any], idle: list[dict[str, Any]]) -> dict[str, Any]:
    def acc(results: list[Any]) -> float | None:
        done = [r for r in results if r is not None]
        return round(sum(r["correct"] for r in done) / len(done), 3) if done else None

    same = sum(1 for a, b in zip(loaded, idle) if a is not None and a["answer"] == b["answer"])
    return {"probes": len(idle), "accuracy_under_load": acc(loaded), "accuracy_idle": acc(idle),
            "identical_answers": f"{same}/{len(idle)}", "loaded": loaded, "idle": idle}


def compiled_vs_eager(model: str, db: Path, *, backend: str, width: int, sessions: int,
                      models_dir: Path | None = None, dtype: str = "float32") -> dict[str, Any]:
    """Replay served turns (their exact stored ids) through an eager and a compiled runner:
    each prompt prefilled at batch 1, the replies teacher-forced together in one padded
    batch; the largest |logit difference| and how often the two argmaxes agree."""
    import torch

    from agent.runtime.checkpoint import load_model
    from agent.runtime.generation import EagerRunner
    from agent.runtime.state import RecurrentState
    from agent.serve.compiling import compiled_runner
    from sessions import SessionStore

    if backend == "none":
        return {"backend": "none", "skipped": "the server ran eager (--compile-backend none)"}
    from agent.runtime.device import parse_dtype
    from agent.runtime.quant import QUANT_MODES

    quant = dtype if dtype in QUANT_MODES else None
    lm = load_model(model, models_dir=models_dir, dtype=parse_dtype("float32" if quant else dtype), quant=quant)
    tok, template = lm.tokenizer, lm.template
    prefix, suffix = template.reply_prefix(tok), template.reply_suffix(tok)
    streams: list[tuple[list[int], list[int]]] = []
    with SessionStore.open(db, readonly=True) as store:
        for summary in store.browse.list_sessions():
            turns = store.tree.branch(summary.session.id)
            if len(turns) < 3 or turns[-1].role != "assistant" or turns[-1].status != "complete":
                continue
            ids = [store.tree.turn_token_ids(t.id) for t in turns]
            reply = ids[-1][len(prefix):len(ids[-1]) - len(suffix)]
            if reply:
                streams.append(([i for part in ids[:-1] for i in part] + prefix, reply))
            if len(streams) >= sessions:
                break
    if not streams:
        return {"backend": backend, "skipped": "no completed turn to replay"}
    torch._dynamo.reset()
    eager = EagerRunner(lm.model, segment_len=128)
    compiled, log = compiled_runner(lm.model, widths=(width,), backend=backend, segment_len=128)
    worst, agree, total = 0.0, 0, 0
    with torch.inference_mode():
        states: dict[str, list[RecurrentState]] = {"e": [], "c": []}
        logits: dict[str, list[torch.Tensor]] = {"e": [], "c": []}
        for prompt, _ in streams:
            for key, runner in (("e", eager), ("c", compiled)):
                out, state = runner.prefill(prompt)
                states[key].append(state)
                logits[key].append(out)
        first_e, first_c = torch.cat(logits["e"]), torch.cat(logits["c"])
        worst = float((first_e - first_c).abs().max())
        agree += int((first_e.argmax(-1) == first_c.argmax(-1)).sum())
        total += len(streams)
        n = len(streams)
        batch = {k: RecurrentState.stack(v).padded_to(width) for k, v in states.items()}
        for t in range(max(len(r) for _, r in streams)):
            tokens = torch.zeros(width, dtype=torch.long)
            live = [i for i, (_, r) in enumerate(streams) if t < len(r)]
            for i in live:
                tokens[i] = streams[i][1][t]
            le, batch["e"] = eager.step(tokens, batch["e"])
            lc, batch["c"] = compiled.step(tokens, batch["c"])
            rows = torch.tensor(live[:n])
            if len(rows):
                worst = max(worst, float((le[rows] - lc[rows]).abs().max()))
                agree += int((le[rows].argmax(-1) == lc[rows].argmax(-1)).sum())
                total += len(rows)
    return {"backend": backend, "turns": len(streams), "positions": total, "max_abs_logit_diff": worst,
            "argmax_agreement": round(agree / total, 6) if total else None, "dtype": str(lm.model.embed.weight.dtype),
            "replay_compiles": log.summary()["compiles"]}


def one_more_user(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Between consecutive user counts: what each added user cost the others (ITL and TTFT
    p50, ms per user) and added to the server (completion tokens/s per user)."""
    out = []
    for a, b in zip(rows, rows[1:]):
        added = b["users"] - a["users"]

        def per_user(key: str, scale: float = 1.0) -> float | None:
            if a.get(key) is None or b.get(key) is None:
                return None
            return round((b[key] - a[key]) / added * scale, 2)

        out.append({"from_users": a["users"], "to_users": b["users"], "itl_p50_ms_per_user": per_user("itl_p50_ms"),
                    "ttft_p50_ms_per_user": per_user("ttft_p50_ms"), "tokens_per_s_per_user": per_user("tokens_per_s")})
    return out


def run_pilot(cfg: PilotConfig, out_dir: Path, *, models_dir: Path | None = None) -> dict[str, Any]:
    """Run the whole pilot and write the report; returns the JSON-able result."""
    from agent.bench.serve_report import write_report

    model = _resolve(cfg.model, models_dir)
    with tempfile.TemporaryDirectory(prefix="laplace-pilot-") as tmp:
        home = Path(tmp)
        t0 = time.monotonic()
        server = ServerProcess(home, model, cfg)
        try:
            driven = asyncio.run(_drive(server.url, cfg, model))
        finally:
            server.stop()
        numerics = compiled_vs_eager(model, home / "laplace.db", backend=cfg.compile_backend, width=max(cfg.widths),
                                     sessions=min(cfg.replay_sessions, max(cfg.widths)), models_dir=models_dir,
                                     dtype=cfg.dtype)
        elapsed = time.monotonic() - t0
    rows = driven["rows"]
    base = rows[0]["tokens_per_s"] or None
    for row in rows:
        row["gain_vs_one_at_a_time"] = round(row["tokens_per_s"] / base, 2) if base else None
    user_rows = [r for r in rows if r.get("users")]
    server_stats = driven["server"]
    compile_info = server_stats.get("compile", {"backend": "none", "compiles": 0, "compiles_after_warmup": 0,
                                                "compile_seconds": 0.0, "events": [], "warmup_seconds": {}})
    distinct_rows = sorted(int(r) for r in server_stats.get("rows_histogram", {}))
    result = {
        "config": {**cfg.__dict__, "model": model}, "rows": rows,
        "summary": {
            "best_gain_vs_one_at_a_time": max((r["gain_vs_one_at_a_time"] or 0) for r in rows[1:]) if len(rows) > 1 else None,
            "compiles_at_warmup": compile_info["compiles"] - compile_info["compiles_after_warmup"],
            "compiles_after_warmup": compile_info["compiles_after_warmup"],
            "warmup_seconds": round(sum(compile_info.get("warmup_seconds", {}).values()), 2),
            "distinct_batch_sizes_seen": len(distinct_rows),
            "padding_waste": server_stats.get("padding_waste"),
            "max_abs_logit_diff": numerics.get("max_abs_logit_diff"),
            "recall_under_load": None, "recall_idle": None,
            "server_startup_s": round(server.startup_s, 1), "pilot_seconds": round(elapsed, 1),
            "one_more_user": one_more_user(user_rows),
            "refused": {r["phase"]: r["refused"] for r in rows if r.get("refused")},
        },
        "limits": server_stats.get("limits", {}),
        "server": {k: v for k, v in server_stats.items() if k != "compile"}, "compile": compile_info,
        "phases": driven["details"],
        "numerics": numerics, "recall": _recall(driven["recall_loaded"], driven["recall_idle"]),
        "raw": driven["raw"],
        "server_log": server.log[-LOG_LINES:],
    }
    result["summary"]["recall_under_load"] = result["recall"]["accuracy_under_load"]
    result["summary"]["recall_idle"] = result["recall"]["accuracy_idle"]
    write_report(result, out_dir)
    return result
