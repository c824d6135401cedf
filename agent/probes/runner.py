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
from typing import Callable

import torch

from agent.runtime.checkpoint import LoadedModel

from agent.probes import text
from agent.probes.engine import Answer, advance_rows, ask_rows
from agent.probes.fillers import Filler, make_filler
from agent.probes.ledger import capture_decays, counterfactual_trace, resume_check, retention_ledger
from agent.probes.suites import Deadline, Plan, Speed, Suite, plan_suite
from agent.probes.tasks import PromptBuilder, Sample, build_sample, candidates, parse_probe

Log = Callable[[str], None]
WARMUP_ROWS = 8  # the warm-up batches this many rows; estimates scale linearly from it


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


def _stream_rng(seed: int, suite: str, probe: str, filler: str, trial: int):  # type: ignore[no-untyped-def]
    # `order` shares passkey's facts (the same key and value): its gap is then paired.
    base = "passkey" if probe == "order" else probe
    return text.rng_of(seed, suite, base, filler, "stream", trial)


class SuiteRunner:
    def __init__(self, loaded: LoadedModel, *, style: str = "completion", seed: int = 0, log: Log | None = None) -> None:
        self.loaded = loaded
        self.model = loaded.model.eval()
        self.prompts = PromptBuilder(loaded.tokenizer, loaded.template, style)
        self.style = style
        self.seed = seed
        self.log = log or (lambda _m: None)
        self.stop_ids = loaded.template.stop_ids(loaded.tokenizer)

    # ---- warm-up ----------------------------------------------------------------------

    def warmup(self, filler: Filler, rows: int) -> Speed:
        """Time filler tokens and one question on `rows` batch rows, after an untimed pass
        (allocations, caches)."""
        t0 = time.perf_counter()
        rng = text.rng_of(self.seed, "warmup")
        samples = [build_sample("passkey", rng, self.prompts, t) for t in range(rows)]
        cands = self._candidates(samples, [rng] * rows)
        ids = filler.tokens(256, rng)
        blank = self._ask(self.model.new_state(rows), samples, cands)
        advance_rows(self.model, self.model.new_state(rows), [ids[:64]] * rows)
        t1 = time.perf_counter()
        _, state = advance_rows(self.model, self.model.new_state(rows), [ids] * rows)
        t2 = time.perf_counter()
        self._ask(state, samples, cands, blank)
        t3 = time.perf_counter()
        self._ask(state, samples, cands)
        t4 = time.perf_counter()
        return Speed(s_per_token=(t2 - t1) / len(ids), s_per_ask=t3 - t2, s_per_blank=max(0.0, (t4 - t3) - (t3 - t2)),
                     warmup_s=t4 - t0, rows=rows)

    # ---- asking -----------------------------------------------------------------------

    def _candidates(self, samples: list[Sample], rngs: list) -> list[list[str]]:  # type: ignore[type-arg]
        return [candidates(s, r, self.prompts) for s, r in zip(samples, rngs)]

    def _ask(self, state, samples: list[Sample], cands: list[list[str]], blank: list[Answer] | None = None) -> list[Answer]:  # type: ignore[no-untyped-def]
        """Ask row b of `state` about samples[b] among cands[b]; reuse `blank` controls if given."""
        ids = [[self.prompts.answer_ids(c) for c in cs] for cs in cands]
        answers = ask_rows(self.model, state, [s.question for s in samples], ids,
                           [cs.index(s.answer) for cs, s in zip(cands, samples)], decode=self.loaded.tokenizer.decode,
                           answers=[s.answer for s in samples], greedy_tokens=[len(i[0]) + 2 for i in ids],
                           stop_ids=self.stop_ids, blank=blank is None)
        if blank is not None:
            answers = [replace(a, blank_logp=b.blank_logp, blank_rank=b.blank_rank) for a, b in zip(answers, blank)]
        return answers

    # ---- the sweep --------------------------------------------------------------------

    def run(self, suite: Suite, *, budget_s: float | None = None) -> Outcome:
        start = time.perf_counter()
        filler_objs = {f: make_filler(f, self.loaded.tokenizer, self.loaded.template) for f in suite.fillers}
        for p in suite.probes:
            parse_probe(p)
        speed = self.warmup(next(iter(filler_objs.values())), min(suite.trials, WARMUP_ROWS)) if budget_s is not None else None
        plan = plan_suite(suite, budget_s, speed)
        s = plan.suite
        out = Outcome(s, self.seed, self.style, skipped=list(plan.skipped), plan=plan)
        deadline = Deadline(budget_s, start)
        distances = sorted(set(s.distances))
        for fname in s.fillers:
            for probe in s.probes:
                self._group(out, s, probe, filler_objs[fname], distances, deadline, ledger=probe == s.probes[0])
            self.log(f"{fname}: done ({time.perf_counter() - start:.1f} s)")
        self._state_metrics(out, s, filler_objs[s.fillers[0]], distances, deadline)
        self._note_missing(out, s, distances)
        return out

    def _group(self, out: Outcome, s: Suite, probe: str, filler: Filler, distances: list[int],
               deadline: Deadline, ledger: bool) -> None:
        """All trials of one (probe, filler) as batch rows: the plant, then one pass over
        the filler, asking every row at each distance. Row 0 feeds the retention ledger."""
        trials = range(s.trials)
        samples = [build_sample(probe, _stream_rng(self.seed, s.name, probe, filler.name, t), self.prompts, t) for t in trials]
        fills = [filler.tokens(distances[-1], text.rng_of(self.seed, s.name, filler.name, "filler", t)) for t in trials]
        _, state = advance_rows(self.model, self.model.new_state(len(samples)), [x.prefix + x.plant for x in samples])
        # One candidate set per trial, shared by every distance: the distances are then paired
        # (the curve shows memory, not distractor luck) and the blank control is asked once.
        base = "passkey" if probe == "order" else probe
        cands = self._candidates(samples, [text.rng_of(self.seed, s.name, base, filler.name, "candidates", t) for t in trials])
        pos, decays, blank = 0, [], None
        for d in distances:
            if deadline.passed():
                return
            if d > pos:
                if ledger:
                    with capture_decays(self.model) as rec:
                        _, state = advance_rows(self.model, state, [f[pos:d] for f in fills])
                    decays.append(rec.take()[:, 0])
                else:
                    _, state = advance_rows(self.model, state, [f[pos:d] for f in fills])
                pos = d
            answers = self._ask(state, samples, cands, blank)
            blank = blank or answers
            stale = [None if x.stale is None else cs[a.pick] == x.stale for a, x, cs in zip(answers, samples, cands)]
            out.answers.setdefault((probe, filler.name, d), []).extend(zip(answers, stale))
            out.kinds.setdefault((probe, filler.name, d), []).extend(x.value_kind for x in samples)
        if ledger and decays:
            out.ledgers[filler.name] = retention_ledger(torch.cat(decays, dim=1), distances)

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


def run_suite(loaded: LoadedModel, suite: Suite, *, budget_s: float | None = None, seed: int = 0,
              style: str = "completion", log: Log | None = None) -> Outcome:
    """Run `suite` on a loaded model (see `report.build_report` for the JSON)."""
    return SuiteRunner(loaded, style=style, seed=seed, log=log).run(suite, budget_s=budget_s)
