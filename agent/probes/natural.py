"""`laplace probe natural`: recall of everyday details said and asked in plain speech.

Each trial is one chat conversation in the model's own template, begun as the chat service
begins a new session (the BOS and an empty system turn). The user mentions a detail in a
held-out phrasing (`natural_text.CONCEPTS`), sometimes beside one or two other details
("distractors", often of the same kind, so the answer must match what was asked, not the
latest value), and the assistant acknowledges each; then whole chat filler messages, at
least `d` tokens of them; then a question, greedy reply. Two questions are asked of the
same state (it is never changed): one about the planted detail, recalled when its value is
in the reply, and one about a detail never given, right when the reply says it was not
told. With recall refresh on, the block chat would fold before the question (the same
rule, `runner.recall_block`) is read into a copy of the state first.

Seeds come from `text.rng_of(seed, "natural", d, t)`, so a run is reproducible and a
trial's text does not depend on the other distances or trials asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Any, Sequence

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.state import RecurrentState

from agent.probes import text
from agent.probes.engine import advance_rows, greedy_rows
from agent.probes.fillers import Piece, make_filler
from agent.probes.natural_text import CONCEPTS, Concept, make_value, mentions, say, says_not_told
from agent.probes.runner import recall_block
from agent.probes.suites import REFRESH_MODES
from agent.recall.horizon import recall_horizon
from agent.recall.rule import DEFAULT_BUDGET

ACK = "Okay, noted."  # the assistant's reply to each stated detail
MAX_REPLY_TOKENS = 40
DEFAULT_DISTANCES = (0, 256, 512, 1024, 2048)
DEFAULT_TRIALS = 16
SAMPLES_PER_ROW = 2  # replies kept per (mode, distance) row, stated and never stated each
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Conversation:
    """One trial: the token ids up to the question, and what is asked after them."""

    concept: Concept
    value: str
    question: str
    absent: Concept  # a concept not stated anywhere in this conversation
    absent_question: str
    distractors: tuple[tuple[str, str], ...]  # (concept name, value) of the other details stated
    ids: list[int]  # system turn, statements and acknowledgements, filler
    said: tuple[tuple[str, str, int], ...]  # the turns before the filler: (role, text, tokens)
    pieces: tuple[Piece, ...]  # the filler's messages
    filler_tokens: int  # >= d: the filler ends at a message boundary


def _other_value(rng, kind: str, taken: set[str]) -> str:  # type: ignore[no-untyped-def]
    for _ in range(100):
        v = make_value(rng, kind)
        if v not in taken:
            return v
    raise ValueError(f"no fresh value of kind {kind!r}")


def build_conversation(lm: LoadedModel, concept: Concept, seed: int, d: int, t: int) -> Conversation:
    """Trial `t` at distance `d` about `concept`, drawn from `rng_of(seed, "natural", d, t)`."""
    tok, template = lm.tokenizer, lm.template
    rng = text.rng_of(seed, "natural", d, t)
    value = make_value(rng, concept.kind)
    others = [c for c in CONCEPTS if c.name != concept.name]
    distractors: list[Concept] = []
    k = rng.choice((0, 0, 1, 2))  # half the trials state one or two other details too
    if k:
        same = [c for c in others if c.kind == concept.kind]
        distractors.append(rng.choice(same or others))
    while len(distractors) < k:
        c = rng.choice(others)
        if c not in distractors:
            distractors.append(c)
    taken = {value}
    facts = [(concept, value)]
    for c in distractors:
        v = _other_value(rng, c.kind, taken)
        taken.add(v)
        facts.append((c, v))
    rng.shuffle(facts)
    absent = rng.choice([c for c in others if c not in distractors])
    question, absent_question = rng.choice(concept.questions), rng.choice(absent.questions)
    ids = list(template.message(tok, "system", "", first=True))  # as ChatService.new_session
    said: list[tuple[str, str, int]] = []
    for c, v in facts:
        for role, body in (("user", say(rng.choice(c.statements), v)), ("assistant", ACK)):
            m = template.message(tok, role, body)
            said.append((role, body, len(m)))
            ids += m
    # Whole messages only: a question after half a message is not a conversation.
    _, pieces = make_filler("chat", tok, template).pieces(d, text.rng_of(seed, "natural", d, t, "filler"))
    for p in pieces:
        ids += template.message(tok, p.role, p.text)
    return Conversation(concept, value, question, absent, absent_question,
                        tuple((c.name, v) for c, v in facts if c is not concept), ids, tuple(said), tuple(pieces),
                        pieces[-1].end if pieces else 0)


def plan(seed: int, d: int, trials: int) -> list[Concept]:
    """The concept of each trial at distance `d`: a seeded order of all concepts, cycled,
    so trials spread over them evenly."""
    order = list(CONCEPTS)
    text.rng_of(seed, "natural", d, "concepts").shuffle(order)
    return [order[t % len(order)] for t in range(trials)]


def _modes(refresh: str) -> tuple[str, ...]:
    if refresh not in REFRESH_MODES:
        raise ValueError(f"unknown refresh mode {refresh!r}; choose off, on or both")
    return ("off", "on") if refresh == "both" else (refresh,)


def run_natural(lm: LoadedModel, *, distances: Sequence[int] = DEFAULT_DISTANCES, trials: int = DEFAULT_TRIALS,
                refresh: str = "both", seed: int = 0, refresh_tokens: int = DEFAULT_BUDGET,
                horizon: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """Run the probe and return its report (JSON-serialisable; see `render`). `horizon`
    overrides the model's recall horizon (`agent.recall.horizon.recall_horizon`, as the suite runner)."""
    modes = _modes(refresh)
    if trials < 1:
        raise ValueError("trials must be at least 1")
    if not distances or any(d < 0 for d in distances):
        raise ValueError("distances must be a non-empty list of token counts >= 0")
    distances = sorted(set(distances))
    hz = None
    if "on" in modes:
        measured, source = recall_horizon(lm)
        hz = {"tokens": horizon, "source": "given"} if horizon is not None else {"tokens": measured, "source": source}
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for d in distances:
        convs = [build_conversation(lm, c, seed, d, t) for t, c in enumerate(plan(seed, d, trials))]
        state = _read(lm, convs)
        for mode in modes:
            replies, hits, blocks = _ask(lm, state, convs, None if mode == "off" else (hz["tokens"], refresh_tokens))  # type: ignore[index]
            rows.append(_row(mode, d, convs, replies, hits, blocks))
            samples += _samples(mode, d, convs, replies)
    return {
        "probe": "natural",
        "schema_version": SCHEMA_VERSION,
        "model": {"name": lm.name, "fingerprint": lm.fingerprint},
        "seed": seed,
        "settings": {"distances": distances, "trials": trials, "refresh": refresh, "refresh_tokens": refresh_tokens,
                     "max_reply_tokens": MAX_REPLY_TOKENS, "acknowledgement": ACK, "filler": "chat", "device": device},
        "horizon": hz,
        "rows": rows,
        "samples": samples,
    }


def _read(lm: LoadedModel, convs: list[Conversation]) -> RecurrentState:
    """Every conversation up to its question, one batch row each."""
    model = lm.model.eval()
    _, state = advance_rows(model, model.new_state(len(convs)), [c.ids for c in convs])
    return state


def _ask(lm: LoadedModel, state: RecurrentState, convs: list[Conversation],
         refresh: tuple[int, int] | None) -> tuple[list[tuple[str, str]], list[bool | None], list[tuple[bool, bool]]]:
    """Each row's (stated, never-stated) replies, whether the stated question's block held
    the value (None without refresh) and whether each question got a block at all. Rows
    B..2B-1 of the asked state are copies of rows 0..B-1 for the second question."""
    tok, template = lm.tokenizer, lm.template
    B = len(convs)
    asked = [c.question for c in convs] + [c.absent_question for c in convs]
    both = RecurrentState.stack([state, state])
    hits: list[bool | None] = [None] * B
    got = [False] * (2 * B)
    if refresh is not None:
        horizon, budget = refresh
        made = [recall_block(lm, q, c.said, c.pieces, c.filler_tokens, horizon=horizon, budget=budget)
                for q, c in zip(asked, convs + convs)]
        hits = [any(r.turn_id < len(c.said) and mentions(r.line, c.value) for r in chosen)
                for c, (_, chosen) in zip(convs, made[:B])]
        got = [bool(ids) for ids, _ in made]
        if any(got):  # rows without a block keep their state exactly
            _, both = advance_rows(lm.model, both, [ids for ids, _ in made])
    prompts = [template.message(tok, "user", q) + template.reply_prefix(tok) for q in asked]
    out = greedy_rows(lm.model, both, prompts, MAX_REPLY_TOKENS, template.stop_ids(tok))
    replies = [tok.decode(ids) for ids in out]
    return list(zip(replies[:B], replies[B:])), hits, list(zip(got[:B], got[B:]))


def score_stated(reply: str, value: str) -> str:
    """recalled (the value is in the reply), refused (says it was not told) or wrong."""
    if mentions(reply, value):
        return "recalled"
    return "refused" if says_not_told(reply) else "wrong"


def score_absent(reply: str) -> str:
    """not_told (says it was not told) or invented (anything else)."""
    return "not_told" if says_not_told(reply) else "invented"


def _row(mode: str, d: int, convs: list[Conversation], replies: list[tuple[str, str]],
         hits: list[bool | None], blocks: list[tuple[bool, bool]]) -> dict[str, Any]:
    n = len(convs)
    stated = [score_stated(a, c.value) for (a, _), c in zip(replies, convs)]
    absent = [score_absent(b) for _, b in replies]
    row: dict[str, Any] = {
        "mode": mode, "distance": d, "n": n, "filler_tokens": round(mean(c.filler_tokens for c in convs), 1),
        "recall": stated.count("recalled") / n, "refused_stated": stated.count("refused") / n,
        "wrong": stated.count("wrong") / n, "not_told": absent.count("not_told") / n,
        "invented": absent.count("invented") / n,
        "with_distractors": sum(1 for c in convs if c.distractors) / n,
    }
    if mode == "on":
        row["refresh"] = {"hit": sum(1 for h in hits if h) / n, "blocks": sum(1 for a, _ in blocks if a) / n,
                          "blocks_never_stated": sum(1 for _, b in blocks if b) / n}
    return row


def _samples(mode: str, d: int, convs: list[Conversation], replies: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = []
    for c, (a, b) in list(zip(convs, replies))[:SAMPLES_PER_ROW]:
        out.append({"mode": mode, "distance": d, "asked": "stated", "concept": c.concept.name, "value": c.value,
                    "question": c.question, "reply": a, "verdict": score_stated(a, c.value)})
        out.append({"mode": mode, "distance": d, "asked": "never stated", "concept": c.absent.name, "value": None,
                    "question": c.absent_question, "reply": b, "verdict": score_absent(b)})
    return out


def render(report: dict[str, Any]) -> str:
    """The report as a table: one row per (refresh mode, distance), then samples (the CLI
    makes it safe for a terminal)."""
    m, s, hz = report["model"], report["settings"], report["horizon"]
    lines = [f"laplace probe natural: model {m['name']} ({m['fingerprint'][:12]}), {s['trials']} trials per row, "
             f"seed {report['seed']}, chat filler in whole messages (tokens = mean filler length)"]
    if hz:
        lines.append(f"refresh: block of at most {s['refresh_tokens']} tokens, turns older than {hz['tokens']} tokens ({hz['source']})")
    head = f"{'refresh':<8}{'distance':>9}{'tokens':>8}{'n':>4}{'recall':>8}{'refused':>9}{'wrong':>7}{'not told':>10}{'invented':>10}{'hit':>6}"
    lines += ["", "stated detail: recall / refused / wrong; never-stated detail: not told / invented; hit: refresh block held the value",
              head, "-" * len(head)]
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    for r in report["rows"]:
        hit = pct(r["refresh"]["hit"]) if "refresh" in r else "-"
        lines.append(f"{r['mode']:<8}{r['distance']:>9}{r['filler_tokens']:>8.0f}{r['n']:>4}{pct(r['recall']):>8}"
                     f"{pct(r['refused_stated']):>9}{pct(r['wrong']):>7}{pct(r['not_told']):>10}{pct(r['invented']):>10}{hit:>6}")
    if report["samples"]:
        lines += ["", "samples:"]
        for x in report["samples"]:
            reply = repr(x["reply"].strip())
            want = f" (value {x['value']})" if x["value"] else ""
            lines.append(f"  [{x['mode']} d={x['distance']}] {x['question']}{want} -> {reply} : {x['verdict']}")
    return "\n".join(lines)
