"""Running a suite: one pass over each filler stream, forked at every distance.

For each (filler, probe, trial) the plant is read once, then the filler in segments; at
each distance the question is asked of the state as it is (asking never changes it), so a
whole distance sweep costs about one pass. Trial 0 of the first probe also records the
decays for the retention ledger. Results are aggregated into cells and row summaries by
`report.build_report`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from agent.runtime.checkpoint import LoadedModel

from agent.probes import text
from agent.probes.engine import SEGMENT, Answer, Stopped, advance_rows, ask_rows
from agent.probes.fillers import Filler, Piece, make_filler
from agent.probes.ledger import counterfactual_trace, resume_check, retention_ledger
from agent.recall.decays import capture_decays
from agent.recall.horizon import recall_horizon
from agent.recall.rule import BLOCK_ROLE, DEFAULT_BUDGET, Candidate, Recalled, block_budget, build_block
from agent.probes.suites import N_CANDIDATES, REFRESH_MODES, Deadline, Plan, Speed, Suite, plan_suite
from agent.probes.tasks import PromptBuilder, Sample, build_sample, candidates, parse_probe

Log = Callable[[str], None]
WARMUP_TOKENS = 128  # filler tokens the warm-up times
WARMUP_ROWS = 8  # a second warm-up batches up to this many rows, when the first was cheap
WARMUP_SHARE = 0.05  # ... that is, when it would take at most this share of the budget


@dataclass
class Outcome:
    """Raw results of a run, before aggregation."""

    suite: Suite
    seed: int
    style: str
    answers: dict[tuple[str, str, int], list[tuple[Answer, bool | None]]] = field(default_factory=dict)
    kinds: dict[tuple[str, str, int], list[str]] = field(default_factory=dict)  # value kind per answer
    ledgers: dict[str, dict] = field(default_factory=dict)
    trace: dict | None = None
    resume: dict | None = None
    skipped: list[dict] = field(default_factory=list)
    plan: Plan | None = None
    # Recall refresh: the settings used, and per refresh cell (hit, block tokens) per trial,
    # hit meaning the block repeated the planted answer.
    refresh: dict | None = None
    blocks: dict[tuple[str, str, int], list[tuple[bool, int]]] = field(default_factory=dict)


def _stream_rng(seed: int, suite: str, probe: str, filler: str, trial: int):  # type: ignore[no-untyped-def]
    # `order` shares passkey's facts (the same key and value): its gap is then paired.
    base = "passkey" if probe == "order" else probe
    return text.rng_of(seed, suite, base, filler, "stream", trial)


REFRESH_SUFFIX = "+refresh"


class SuiteRunner:
    def __init__(self, loaded: LoadedModel, *, style: str = "completion", seed: int = 0, log: Log | None = None,
                 refresh: str = "off", refresh_tokens: int = DEFAULT_BUDGET, refresh_horizon: int = 0) -> None:
        if refresh not in REFRESH_MODES:
            raise ValueError(f"unknown refresh mode {refresh!r}; choose off, on or both")
        self.refresh = refresh
        self.refresh_tokens = refresh_tokens
        if refresh != "off":
            measured, source = recall_horizon(loaded)
            self.horizon, self.horizon_source = (refresh_horizon, "--refresh-horizon") if refresh_horizon else (measured, source)
        self.loaded = loaded
        self.model = loaded.model.eval()
        self.prompts = PromptBuilder(loaded.tokenizer, loaded.template, style)
        self.style = style
        self.seed = seed
        self.log = log or (lambda _m: None)
        self.stop_ids = loaded.template.stop_ids(loaded.tokenizer)
        self.n_candidates = N_CANDIDATES

    # ---- warm-up ----------------------------------------------------------------------

    def warmup(self, filler: Filler, deadline: Deadline, rows: int = 1) -> Speed | None:
        """Time `rows` batch rows: filler tokens, and a question with its blank control,
        after an untimed short pass (allocations, caches). The rows have read no plant, so
        the question is answered at chance: the most a question can cost (a state that
        remembers lets most distractors go unread), and the plan is pessimistic. None when
        the deadline passes first."""
        t0 = time.perf_counter()
        rng = text.rng_of(self.seed, "warmup")
        samples = [build_sample("passkey", rng, self.prompts, t) for t in range(rows)]
        cands = self._candidates(samples, [rng] * rows)
        ids = filler.tokens(WARMUP_TOKENS, rng)
        advance_rows(self.model, self.model.new_state(rows), [ids[:32]] * rows)
        t1 = time.perf_counter()
        _, state = advance_rows(self.model, self.model.new_state(rows), [ids] * rows)
        t2 = time.perf_counter()
        if deadline.passed():
            return None
        try:
            self._ask(state, samples, cands, deadline=deadline)
        except Stopped:
            return None
        t3 = time.perf_counter()
        # The blank control is about half of that question's work (the same question on a
        # blank state beside it).
        return Speed(s_per_token=(t2 - t1) / len(ids), s_per_ask=(t3 - t2) / 2, s_per_blank=(t3 - t2) / 2,
                     warmup_s=t3 - t0, rows=rows)

    def _speed(self, filler: Filler, deadline: Deadline, budget_s: float, trials: int) -> Speed | None:
        """One row timed; then, when that was cheap enough (a small model, whose cost is
        mostly per call rather than per row), as many rows as a sweep batches, so the
        estimate is not scaled up from one row."""
        one = self.warmup(filler, deadline)
        rows = min(trials, WARMUP_ROWS)
        if one is None or rows <= 1 or one.warmup_s * rows > WARMUP_SHARE * budget_s:
            return one
        more = self.warmup(filler, deadline, rows)
        return one if more is None else replace(more, warmup_s=one.warmup_s + more.warmup_s)

    # ---- asking -----------------------------------------------------------------------

    def _candidates(self, samples: list[Sample], rngs: list) -> list[list[str]]:  # type: ignore[type-arg]
        return [candidates(s, r, self.prompts, self.n_candidates) for s, r in zip(samples, rngs)]

    def _ask(self, state, samples: list[Sample], cands: list[list[str]], blank: list[Answer] | None = None,  # type: ignore[no-untyped-def]
             deadline: Deadline | None = None) -> list[Answer]:
        """Ask row b of `state` about samples[b] among cands[b]; reuse `blank` controls if given.
        Raises `Stopped` when `deadline` passes part-way."""
        ids = [[self.prompts.answer_ids(c) for c in cs] for cs in cands]
        # Greedy: the answer's tokens and one more, which shows whether the answer ends
        # there (`exact`); a model that says it takes no call beyond the true answer's.
        answers = ask_rows(self.model, state, [s.question for s in samples], ids,
                           [cs.index(s.answer) for cs, s in zip(cands, samples)], decode=self.loaded.tokenizer.decode,
                           answers=[s.answer for s in samples], greedy_tokens=[len(i[0]) + 1 for i in ids],
                           stop_ids=self.stop_ids, blank=blank is None, stop=None if deadline is None else deadline.passed,
                           blank_first_only=True)  # the report keeps only "the blank ranks it first"
        if blank is not None:
            answers = [replace(a, blank_logp=b.blank_logp, blank_rank=b.blank_rank) for a, b in zip(answers, blank)]
        return answers

    # ---- the sweep --------------------------------------------------------------------

    def run(self, suite: Suite, *, budget_s: float | None = None, started: float | None = None) -> Outcome:
        """The sweep, then the state metrics. With a budget, everything from `started` (the
        caller's clock when the command began; default now) counts against it: the warm-up
        that plans the sweep, the sweep, the state metrics. Whatever the deadline cuts is
        listed as skipped; what was measured before it is kept."""
        start = time.perf_counter() if started is None else started
        self.n_candidates = suite.candidates
        deadline = Deadline(budget_s, start)
        filler_objs = {f: make_filler(f, self.loaded.tokenizer, self.loaded.template) for f in suite.fillers}
        for p in suite.probes:
            parse_probe(p)
        speed = None
        if budget_s is not None:
            speed = self._speed(next(iter(filler_objs.values())), deadline, budget_s, suite.trials)
            if speed is not None:
                self.log(f"warm-up: {speed.warmup_s:.1f} s")
        if speed is not None and self.refresh != "off":  # each distance is asked twice
            speed = replace(speed, s_per_ask=2 * speed.s_per_ask)
        plan = plan_suite(suite, budget_s, speed, spent_s=time.perf_counter() - start)
        s = plan.suite
        out = Outcome(s, self.seed, self.style, skipped=list(plan.skipped), plan=plan)
        distances = sorted(set(s.distances))
        for fname in s.fillers:
            for probe in s.probes:
                self._group(out, s, probe, filler_objs[fname], distances, deadline, ledger=probe == s.probes[0])
            self.log(f"{fname}: done ({time.perf_counter() - start:.1f} s)")
        self._state_metrics(out, s, filler_objs[s.fillers[0]], distances, deadline)
        self._note_missing(out, s, distances)
        if self.refresh != "off":
            out.refresh = {"mode": self.refresh, "horizon": self.horizon, "horizon_source": self.horizon_source,
                           "tokens": self.refresh_tokens}
            names = [[p, p + REFRESH_SUFFIX] if self.refresh == "both" else [p + REFRESH_SUFFIX] for p in s.probes]
            out.suite = replace(s, probes=tuple(n for pair in names for n in pair))
        return out

    def _group(self, out: Outcome, s: Suite, probe: str, filler: Filler, distances: list[int],
               deadline: Deadline, ledger: bool) -> None:
        """All trials of one (probe, filler) as batch rows: the plant, then one pass over
        the filler, asking every row at each distance. Row 0 feeds the retention ledger."""
        if deadline.passed():
            return
        trials = range(s.trials)
        samples = [build_sample(probe, _stream_rng(self.seed, s.name, probe, filler.name, t), self.prompts, t) for t in trials]
        made = [filler.pieces(distances[-1], text.rng_of(self.seed, s.name, filler.name, "filler", t)) for t in trials]
        fills, pieces = [m[0] for m in made], [m[1] for m in made]
        _, state = advance_rows(self.model, self.model.new_state(len(samples)), [x.prefix + x.plant for x in samples])
        # One candidate set per trial, shared by every distance: the distances are then paired
        # (the curve shows memory, not distractor luck) and the blank control is asked once.
        base = "passkey" if probe == "order" else probe
        cands = self._candidates(samples, [text.rng_of(self.seed, s.name, base, filler.name, "candidates", t) for t in trials])
        pos, decays, blank = 0, [], None
        for d in distances:
            if deadline.passed():
                break
            # The filler in pieces of at most SEGMENT tokens, the deadline checked between
            # them: a long stretch never runs far past it.
            while pos < d and not deadline.passed():
                end = min(d, pos + SEGMENT)
                if ledger:
                    with capture_decays(self.model) as rec:
                        _, state = advance_rows(self.model, state, [f[pos:end] for f in fills])
                    decays.append(rec.take()[:, 0])
                else:
                    _, state = advance_rows(self.model, state, [f[pos:end] for f in fills])
                pos = end
            if pos < d or deadline.passed():  # the filler took the time: no question at this distance
                break
            try:
                answers = self._ask(state, samples, cands, blank, deadline)
            except Stopped:  # the deadline came part-way through this question: it is not kept
                break
            blank = blank or answers
            self._store(out, probe, filler.name, d, samples, cands, answers)
            if self.refresh != "off" and not deadline.passed():
                blocks = [self._recall_block(x, p, d) for x, p in zip(samples, pieces)]
                if any(ids for ids, _ in blocks):  # rows without a block keep their state exactly
                    _, refreshed = advance_rows(self.model, state, [ids for ids, _ in blocks])
                    try:
                        answers = self._ask(refreshed, samples, cands, blank, deadline)
                    except Stopped:
                        break
                name = probe + REFRESH_SUFFIX
                self._store(out, name, filler.name, d, samples, cands, answers)
                out.blocks.setdefault((name, filler.name, d), []).extend((hit, len(ids)) for ids, hit in blocks)
        if ledger and decays:
            out.ledgers[filler.name] = retention_ledger(torch.cat(decays, dim=1), distances)

    @staticmethod
    def _store(out: Outcome, probe: str, filler: str, d: int, samples: list[Sample], cands: list[list[str]],
               answers: list[Answer]) -> None:
        stale = [None if x.stale is None else cs[a.pick] == x.stale for a, x, cs in zip(answers, samples, cands)]
        out.answers.setdefault((probe, filler, d), []).extend(zip(answers, stale))
        out.kinds.setdefault((probe, filler, d), []).extend(x.value_kind for x in samples)

    def _recall_block(self, sample: Sample, pieces: list[Piece], d: int) -> tuple[list[int], bool]:
        """The recall block chat would fold before this question, `d` filler tokens after
        the plant, and whether it repeats the answer."""
        ids, chosen = recall_block(self.loaded, sample.asked, sample.said, pieces, d,
                                   horizon=self.horizon, budget=self.refresh_tokens)
        hit = any(r.turn_id < len(sample.said) and sample.answer in r.line for r in chosen)
        return ids, hit

    def _state_metrics(self, out: Outcome, s: Suite, filler: Filler, distances: list[int], deadline: Deadline) -> None:
        rng = _stream_rng(self.seed, s.name, "passkey", filler.name, 0)
        sample = build_sample("passkey", rng, self.prompts, 0)
        fill = filler.tokens(distances[-1], text.rng_of(self.seed, s.name, filler.name, "filler", 0))
        if deadline.passed():
            out.skipped.append({"probe": "trace", "filler": filler.name, "distance": "*", "what": "state metric", "reason": "deadline"})
        else:
            out.trace = self._trace(sample, fill, distances, rng, filler.name)
            if out.trace is None:
                out.skipped.append({"probe": "trace", "filler": filler.name, "distance": "*", "what": "state metric",
                                    "reason": "no counterfactual value of the same token length"})
        if deadline.passed():
            out.skipped.append({"probe": "resume", "filler": filler.name, "distance": "*", "what": "state metric", "reason": "deadline"})
            return
        ids = sample.prefix + sample.plant + fill[:256] + sample.question
        out.resume = resume_check(self.model, ids, self.loaded.fingerprint)

    def _trace(self, sample: Sample, fill: list[int], distances: list[int], rng, filler: str) -> dict | None:  # type: ignore[no-untyped-def]
        a = sample.prefix + sample.plant
        for other in candidates(sample, rng, self.prompts):
            if other == sample.answer:
                continue
            b = sample.prefix + self.prompts.statement(f"The code for the {sample.key} is {other}.")
            if len(b) == len(a):
                result = counterfactual_trace(self.model, a, b, fill, distances, sample.question,
                                              self.prompts.answer_ids(sample.answer))
                result.update({"filler": filler, "value_a": sample.answer, "value_b": other})
                return result
        return None

    def _note_missing(self, out: Outcome, s: Suite, distances: list[int]) -> None:
        for fname in s.fillers:
            for probe in s.probes:
                for d in distances:
                    n = len(out.answers.get((probe, fname, d), []))
                    if n < s.trials:
                        out.skipped.append({"probe": probe, "filler": fname, "distance": d,
                                            "what": f"{s.trials - n} of {s.trials} trials", "reason": "deadline"})


def recall_block(loaded: LoadedModel, asked: str, said: Sequence[tuple[str, str, int]], pieces: Sequence[Piece], d: int,
                 *, horizon: int, budget: int) -> tuple[list[int], list[Recalled]]:
    """The recall block chat would fold before `asked` (the same `agent.recall.rule.build_block`)
    and the turns it repeats. `said` are the turns before the filler as (role, text, token
    count); `pieces` the filler's, of which those ending by token `d` (the question's
    position) count. Turns are numbered in stream order, `said` first, so an id below
    len(said) is one of them and a larger id is a more recent turn. ([], []) when nothing
    qualifies."""
    tok, template = loaded.tokenizer, loaded.template
    cands, left = [], sum(n for _, _, n in said)
    for i, (role, body, n) in enumerate(said):
        left -= n
        cands.append(Candidate(i, role, body, d + left))
    base = len(cands)
    cands += [Candidate(base + j, p.role, p.text, d - p.end) for j, p in enumerate(pieces) if p.end <= d]
    block = build_block(asked, cands, horizon=horizon, budget=block_budget(loaded.config, budget),
                        encode=lambda t: template.message(tok, BLOCK_ROLE, t))
    return ([], []) if block is None else (block.token_ids, block.chosen)


def run_suite(loaded: LoadedModel, suite: Suite, *, budget_s: float | None = None, seed: int = 0,
              style: str = "completion", log: Log | None = None, refresh: str = "off",
              refresh_tokens: int = DEFAULT_BUDGET, refresh_horizon: int = 0, started: float | None = None) -> Outcome:
    """Run `suite` on a loaded model (see `report.build_report` for the JSON). With `refresh`
    on or both, every cell is also asked after the recall block chat would fold (rows
    named PROBE+refresh)."""
    return SuiteRunner(loaded, style=style, seed=seed, log=log, refresh=refresh, refresh_tokens=refresh_tokens,
                       refresh_horizon=refresh_horizon).run(suite, budget_s=budget_s, started=started)
