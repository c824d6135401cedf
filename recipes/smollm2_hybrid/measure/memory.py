"""The window hybrid's bounded sparse memory, measured (issue 37): does keeping M evicted
keys per layer and kv head bring back what the window lets go?

    python -m recipes.smollm2_hybrid.measure.memory passkey --model DIR --memory-slots 64,128 --policy recall,attention --out passkey.json
    python -m recipes.smollm2_hybrid.measure.memory detail --model DIR --memory-slots 64,128 --policy recall,attention --out detail.json
    python -m recipes.smollm2_hybrid.measure.memory ppl --model DIR --memory-slots 64,128 --policy recall,attention --out ppl.json
    python -m recipes.smollm2_hybrid.measure.memory table passkey.json detail.json ppl.json

Every measurement compares, in the same run and on the same weights (loaded once; memory
adds no parameters, so each variant is the model rebuilt around the same tensors with
its config changed, `variant_config`):
- `full`: the window raised past the longest sequence the run reads, memory off. Within
  S + W tokens the hybrid is its teacher exactly, so this is the teacher (with whatever
  delta the model ships). Its window is sized per length, not fixed: the ring is read
  whole at every step, so a 16k window would cost 16k keys a query at every length.
- `window`: the model as configured, memory_slots 0.
- `POLICY-M`: memory_slots M, memory_policy POLICY.

`passkey`: a 5-digit code stated as the passkey probe states it (`tasks.build_sample`,
chat style), at a seeded depth of 10-50% of the total length, in the probe's filler; then
the question with the probe's cue; greedy reply; hit when the 5 digits appear in it.
`detail`: `laplace probe natural`'s held-out conversations (`natural.build_conversation`)
with 1.5, 2 and 4 times W tokens of chat filler between the detail and its question;
recall share, its ratio to full attention, and the recall horizon (`memory_report`).
`ppl`: held-out perplexity by query position (`evaluate.held_out_docs` when --corpus is
given, else the standard library's English, `recipes.smollm2_hybrid.text`): below S + W
(where every variant must equal full attention), and from S + W on up to each of --bands.

Greedy, recall refresh off (no chat service runs here). Prompts are read in 512-token
segments with the state carried (`engine.advance_rows`, last logits only), in batches of
rows whose states fit --state-mb, so memory stays bounded at 8k tokens.

`passkey` and `detail` take `--runtime engine`: each trial read and answered one at a time
by the torch-free engine chat runs (`agent.runtime.native.engine`, the same weights with the
variant's config; `--weights fp32` by default, as the torch path loads them, or int8, what
chat runs), several times faster on this CPU than torch's batched rows. The engine keeps a
memory by the novelty policy only; other policies are refused before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from agent.probes import natural, text
from agent.probes.engine import advance_rows, greedy_rows
from agent.probes.fillers import FILLER_KINDS, make_filler
from agent.probes.tasks import PromptBuilder, build_sample
from agent.runtime.checkpoint import LoadedModel, model_from_tensors
from agent.runtime.config import LaplaceConfig
from recipes.smollm2_hybrid.measure.memory_report import detail_horizon, render_table
from recipes.smollm2_hybrid.measure.perplexity import perplexity, token_losses

SCHEMA_VERSION = 1
PASSKEY_REPLY_TOKENS = 12  # a space, five digits and a little more
DEPTH = (0.1, 0.5)  # where the code sits, as a share of the total length
WITHIN_TOL = 1e-3  # losses below S + W may differ from full attention's by float rounding only
Log = Callable[[str], None]


class MeasureError(ValueError):
    """The run cannot be made as asked; the message says what to change."""


@dataclass(frozen=True)
class Variant:
    name: str  # "full", "window" or "POLICY-M"
    slots: int
    policy: str | None

    def describe(self, config: LaplaceConfig) -> dict[str, Any]:
        return {"name": self.name, "memory_slots": self.slots, "memory_policy": self.policy, "window": config.window,
                "sinks": config.sinks}


FULL, WINDOW = Variant("full", 0, None), Variant("window", 0, None)


def variants(slots: Sequence[int], policies: Sequence[str]) -> list[Variant]:
    """full and window first (the references), then every policy x M with M > 0."""
    return [FULL, WINDOW] + [Variant(f"{p}-{m}", m, p) for p in policies for m in sorted(set(slots)) if m > 0]


def full_window(config: LaplaceConfig, tokens: int) -> int:
    """A window under which every query of a `tokens`-long stream sees every key (t < S + W):
    the model's own W times the fewest whole times it takes."""
    return config.window * max(1, math.ceil((tokens - config.sinks) / config.window))


def variant_config(config: LaplaceConfig, v: Variant, tokens: int) -> LaplaceConfig:
    """The model's config for variant `v` over streams of at most `tokens` tokens."""
    if config.mixer != "window":
        raise MeasureError(f"this measures the window mixer's memory; the model's mixer is {config.mixer!r}")
    changes: dict[str, Any] = {"window": full_window(config, tokens)} if v == FULL else {}
    if "memory_slots" in {f.name for f in dataclasses.fields(config)}:
        changes["memory_slots"] = v.slots
        if not v.slots and getattr(config, "memory_rest_slots", 0):
            changes["memory_rest_slots"] = 0  # full attention or the window alone: no memory of either size
        if v.policy is not None:
            changes["memory_policy"] = v.policy
    elif v.slots:
        raise MeasureError("this laplace's LaplaceConfig has no memory_slots yet; run with --memory-slots 0 "
                           "(full attention and the window alone) or update laplace")
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as exc:
        raise MeasureError(f"variant {v.name}: {exc}") from None


def variant_model(lm: LoadedModel, v: Variant, tokens: int) -> LoadedModel:
    """`lm` rebuilt as variant `v`: the same weight tensors (shared, not copied)."""
    config = variant_config(lm.config, v, tokens)
    model = model_from_tensors(config, dict(lm.model.state_dict()), where=f"variant {v.name}").eval()
    return LoadedModel(model, lm.tokenizer, lm.template, name=f"{lm.name} ({v.name})", path=lm.path, card=lm.card)


# ---- reading and asking ------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One trial: the context read first, then the question, whose greedy reply is scored."""

    context: list[int]
    question: list[int]
    answer: str
    distance: int  # tokens from the end of the turn that states the answer to the end of the question


def answer_tasks(lm: LoadedModel, tasks: Sequence[Task], max_new: int, state_bytes: int) -> list[str]:
    """Greedy replies: contexts read in segments, as many rows a call as fit `state_bytes`."""
    model, tok = lm.model, lm.tokenizer
    per = max(1, state_bytes // model.config.state_bytes(1))
    stops = lm.template.stop_ids(tok)
    replies: list[str] = []
    for lo in range(0, len(tasks), per):
        part = tasks[lo:lo + per]
        _, state = advance_rows(model, model.new_state(len(part)), [t.context for t in part])
        out = greedy_rows(model, state, [t.question for t in part], max_new, stops)
        replies += [tok.decode(ids) for ids in out]
        del state
    return replies


def engine_answers(lm: LoadedModel, v: Variant, tokens: int, tasks: Sequence[Task], max_new: int, *, weights: str,
                   threads: int) -> list[str]:
    """Greedy replies on the torch-free engine: each task's context and question read into a
    fresh state, then up to `max_new` steps (a stop token ends the reply, as greedy_rows)."""
    import numpy as np

    from agent.runtime.native.engine import Engine, EngineUnavailable

    if lm.path is None:
        raise MeasureError("--runtime engine reads the model's directory; load it from one")
    try:
        engine = Engine.load(lm.path, weights=weights, threads=threads, config=variant_config(lm.config, v, tokens))
    except EngineUnavailable as exc:
        raise MeasureError(f"--runtime engine, variant {v.name}: {exc}") from None
    stops = set(lm.template.stop_ids(lm.tokenizer))
    replies = []
    for t in tasks:
        state = engine.new_state()
        engine.prefill(t.context, state)
        logits = engine.prefill(t.question, state)
        out: list[int] = []
        for _ in range(max_new):
            tok = int(np.argmax(logits))
            if tok in stops:
                break
            out.append(tok)
            if len(out) < max_new:
                logits = engine.step(tok, state)
        replies.append(lm.tokenizer.decode(out))
    return replies


def has_code(reply: str, code: str) -> bool:
    """The digits appear in the reply as one number (not inside a longer one)."""
    return re.search(rf"(?<!\d){re.escape(code)}(?!\d)", reply) is not None


def passkey_tasks(lm: LoadedModel, length: int, trials: int, seed: int, filler: str = "grammar") -> list[Task]:
    """`trials` streams of exactly `length` tokens: BOS, filler, the passkey probe's chat
    statement of a 5-digit code at a seeded depth (moved back to the end of the filler's
    last whole piece before it), filler, its question and cue."""
    prompts = PromptBuilder(lm.tokenizer, lm.template, "chat")
    fill = make_filler(filler, lm.tokenizer, lm.template)
    out = []
    for t in range(trials):
        rng = text.rng_of(seed, "memory", "passkey", length, t)
        s = build_sample("passkey", rng, prompts, 0)  # the probe's trial 0 plants 5 digits
        assert s.value_kind == "digits", s.value_kind
        before = max(0, round(rng.uniform(*DEPTH) * length) - len(s.prefix))
        after = length - len(s.prefix) - before - len(s.plant) - len(s.question)
        if after < 0:
            raise MeasureError(f"length {length} is too short for the passkey's statement and question; use a longer one")
        ids, pieces = fill.pieces(before + after, rng)
        cut = max((p.end for p in pieces if p.end <= before), default=0)  # between two whole sentences
        before, after = cut, after + before - cut
        out.append(Task(s.prefix + ids[:before] + s.plant + ids[before:], s.question, s.answer, after + len(s.question)))
    return out


def detail_tasks(lm: LoadedModel, distance: int, trials: int, seed: int) -> list[Task]:
    """`laplace probe natural`'s conversations at `distance` tokens of chat filler, asked
    the stated detail's question."""
    tok, template = lm.tokenizer, lm.template
    out = []
    for t, concept in enumerate(natural.plan(seed, distance, trials)):
        c = natural.build_conversation(lm, concept, seed, distance, t)
        question = template.message(tok, "user", c.question) + template.reply_prefix(tok)
        out.append(Task(c.ids, question, c.value, c.filler_tokens + len(question)))
    return out


def _ask_all(lm: LoadedModel, vs: Sequence[Variant], tasks: Sequence[Task], tokens: int, max_new: int,
             score: Callable[[str, str], bool], state_bytes: int, log: Log, what: str,
             engine: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each variant's replies to `tasks` (read up to `tokens` tokens each): hits, and every
    reply with its answer (a miss is read, not guessed at: a wrong code, a refusal, nothing).
    `engine` ({"weights", "threads"}): on the torch-free engine instead of torch."""
    out = {}
    for v in vs:
        t0 = time.perf_counter()
        if engine is not None:
            replies = engine_answers(lm, v, tokens, tasks, max_new, **engine)
        else:
            replies = answer_tasks(variant_model(lm, v, tokens), tasks, max_new, state_bytes)
        hits = [score(r, t.answer) for r, t in zip(replies, tasks)]
        out[v.name] = {"n": len(tasks), "hits": sum(hits), "score": sum(hits) / len(tasks),
                       "samples": [{"answer": t.answer, "reply": r, "hit": h} for t, r, h in zip(tasks, replies, hits)]}
        log(f"{what} {v.name}: {sum(hits)}/{len(tasks)} ({time.perf_counter() - t0:.0f} s)")
    return out


def run_passkey(lm: LoadedModel, vs: Sequence[Variant], lengths: Sequence[int], trials: int, seed: int, *,
                filler: str = "grammar", state_bytes: int = 512 << 20, log: Log = print,
                engine: dict[str, Any] | None = None) -> dict[str, Any]:
    rows = []
    for length in sorted(set(lengths)):
        tasks = passkey_tasks(lm, length, trials, seed, filler)
        res = _ask_all(lm, vs, tasks, length + PASSKEY_REPLY_TOKENS, PASSKEY_REPLY_TOKENS, has_code, state_bytes, log,
                       f"passkey {length} tokens", engine)
        rows.append({"length": length, "mean_distance": sum(t.distance for t in tasks) / len(tasks), "variants": res})
    return _report(lm, "passkey", vs, seed, {"lengths": sorted(set(lengths)), "trials": trials, "filler": filler,
                                             "reply_tokens": PASSKEY_REPLY_TOKENS, "runtime": _runtime(engine)}, rows)


def _runtime(engine: dict[str, Any] | None) -> str:
    return "torch" if engine is None else f"engine ({engine['weights']})"


def run_detail(lm: LoadedModel, vs: Sequence[Variant], multiples: Sequence[float], trials: int, seed: int, *,
               state_bytes: int = 512 << 20, log: Log = print, engine: dict[str, Any] | None = None) -> dict[str, Any]:
    W = lm.config.window
    rows = []
    for m in sorted(set(multiples)):
        d = round(m * W)
        tasks = detail_tasks(lm, d, trials, seed)
        longest = max(len(t.context) + len(t.question) for t in tasks) + natural.MAX_REPLY_TOKENS
        res = _ask_all(lm, vs, tasks, longest, natural.MAX_REPLY_TOKENS,
                       lambda reply, value: natural.score_stated(reply, value) == "recalled", state_bytes, log,
                       f"detail {d} tokens ({m:g} W)", engine)
        full = res[FULL.name]["score"] if FULL.name in res else None
        for r in res.values():
            r["ratio_to_full"] = r["score"] / full if full else None
        rows.append({"distance": d, "multiple": m, "mean_distance": sum(t.distance for t in tasks) / len(tasks), "variants": res})
    rep = _report(lm, "detail", vs, seed, {"multiples": sorted(set(multiples)), "trials": trials,
                                           "reply_tokens": natural.MAX_REPLY_TOKENS, "runtime": _runtime(engine)}, rows)
    rep["horizon"] = {v.name: detail_horizon([(r["distance"], r["variants"][v.name]["score"]) for r in rows]) for v in vs}
    return rep


def ppl_docs(lm: LoadedModel, tokens: int, docs: int, corpus: Path | None) -> tuple[str, list[tuple[str, list[int]]]]:
    """(where the text came from, [(doc id, first `tokens` ids)])."""
    if corpus is not None:
        from recipes.smollm2_hybrid.measure.evaluate import held_out_docs

        picked = held_out_docs(corpus, lm.tokenizer.encode, tokens, docs)
        source = f"{corpus}/heldout.jsonl"
    else:
        from recipes.smollm2_hybrid.text import TEXTS

        picked = [(name, lm.tokenizer.encode(make(8 * tokens))[:tokens]) for name, make in sorted(TEXTS.items())][:docs]
        source = "the standard library's English (recipes.smollm2_hybrid.text: " + ", ".join(n for n, _ in picked) + ")"
    if not picked or any(len(ids) < tokens for _, ids in picked):
        raise MeasureError(f"not enough held-out text for {tokens} tokens in {source}; lower --bands")
    return source, picked


def run_ppl(lm: LoadedModel, vs: Sequence[Variant], docs: Sequence[tuple[str, list[int]]], bands: Sequence[int], *,
            segment: int = 512, source: str = "", log: Log = print) -> dict[str, Any]:
    """Per-token losses of every variant; perplexity below S + W and from S + W to each band."""
    tokens = max(len(ids) for _, ids in docs)
    edge = lm.config.sinks + lm.config.window
    cuts = {"within": (0, edge)} | {f"past_{b}": (edge, b - 1) for b in sorted(set(bands)) if edge < b <= tokens}
    losses: dict[str, list[list[float]]] = {}
    rows = {}
    for v in vs:
        t0 = time.perf_counter()
        model = variant_model(lm, v, tokens).model
        losses[v.name] = [token_losses(model, ids, segment) for _, ids in docs]
        rows[v.name] = {k: perplexity(losses[v.name], lo, hi) for k, (lo, hi) in cuts.items()}
        log(f"ppl {v.name}: " + ", ".join(f"{k} {x:.3f}" for k, x in rows[v.name].items()) + f" ({time.perf_counter() - t0:.0f} s)")
    full = losses.get(FULL.name, [])  # --skip full: nothing to check the variants against
    for v in vs if full else ():  # below S + W every variant reads every key: the same losses as full attention
        diff = max(abs(a - b) for x, y in zip(losses[v.name], full) for a, b in zip(x[:edge], y[:edge]))
        rows[v.name]["within_max_abs_diff"] = diff
        if diff > WITHIN_TOL:
            log(f"WARNING: {v.name} is not full attention below S + W (losses differ by up to {diff:.2e}): a bug")
    rep = _report(lm, "ppl", vs, 0, {"tokens": tokens, "bands": sorted(set(bands)), "segment": segment, "edge": edge,
                                     "cuts": {k: list(c) for k, c in cuts.items()}, "source": source, "docs": [d for d, _ in docs]},
                  [{"variants": rows}])
    return rep


def _report(lm: LoadedModel, measure: str, vs: Sequence[Variant], seed: int, settings: dict[str, Any],
            rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"measure": measure, "schema_version": SCHEMA_VERSION,
            "model": {"name": lm.name, "fingerprint": lm.fingerprint, "window": lm.config.window, "sinks": lm.config.sinks,
                      "dtype": "float32"},  # fp32 weights, whatever the card runs chat in: variants share tensors
            "variants": [{"name": v.name, "memory_slots": v.slots, "memory_policy": v.policy} for v in vs],
            "seed": seed, "settings": settings, "rows": rows}


# ---- the command line --------------------------------------------------------------------


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _words(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


QUICK = {"passkey": {"lengths": [512], "trials": 1}, "detail": {"multiples": [1.5], "trials": 1},
         "ppl": {"bands": [512], "docs": 1}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    cmds = {"passkey": sub.add_parser("passkey", help="a 5-digit code in filler, by total length"),
            "detail": sub.add_parser("detail", help="a detail said in chat, asked 1.5-4 W tokens later"),
            "ppl": sub.add_parser("ppl", help="held-out perplexity within S + W and past it")}
    for p in cmds.values():
        p.add_argument("--model", type=Path, required=True, help="a model directory (the default model's, say)")
        p.add_argument("--memory-slots", type=_ints, default=[64, 128], help="M per layer and kv head, comma-separated")
        p.add_argument("--policy", type=_words, default=["recall", "attention", "novelty"],
                       help="memory policies, comma-separated: recall, attention, novelty")
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--state-mb", type=int, default=512, help="state of the rows read in one call, at most")
        p.add_argument("--quick", action="store_true", help="a smoke run: one short length or distance, one trial")
        p.add_argument("--skip", type=_words, default=[], help="variants left out, e.g. full,window (a screen of policies)")
        p.add_argument("--out", type=Path, required=True)
    for name in ("passkey", "detail"):
        cmds[name].add_argument("--runtime", choices=("torch", "engine"), default="torch",
                                help="engine: each trial on the torch-free engine chat runs (novelty memory only)")
        cmds[name].add_argument("--weights", choices=("fp32", "int8"), default="fp32",
                                help="--runtime engine: the weights it reads (int8: what chat runs; needs the int8 cache)")
    cmds["passkey"].add_argument("--lengths", type=_ints, default=[1024, 2048, 4096, 8192])
    cmds["passkey"].add_argument("--trials", type=int, default=10)
    cmds["passkey"].add_argument("--filler", choices=FILLER_KINDS, default="grammar")
    cmds["detail"].add_argument("--multiples", type=_floats, default=[1.5, 2.0, 4.0], help="distances in windows W")
    cmds["detail"].add_argument("--trials", type=int, default=16)
    cmds["ppl"].add_argument("--bands", type=_ints, default=[2048, 4096], help="read this many tokens; report S+W..each")
    cmds["ppl"].add_argument("--docs", type=int, default=2)
    cmds["ppl"].add_argument("--segment", type=int, default=512)
    cmds["ppl"].add_argument("--corpus", type=Path, help="the corpus builder's folder (heldout.jsonl); "
                             "default: the standard library's English")
    t = sub.add_parser("table", help="a markdown table of the JSON files")
    t.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        print(render_table([json.loads(p.read_text()) for p in args.files]))
        return
    try:
        report = _measure(args)
    except MeasureError as exc:
        raise SystemExit(f"error: {exc}") from None
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from agent.runtime.checkpoint import load_model_dir

    if args.quick:
        for k, v in QUICK[args.cmd].items():
            setattr(args, k, v)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    log: Log = lambda m: print(f"[{time.perf_counter() - t0:6.0f} s] {m}", flush=True)  # noqa: E731
    lm = load_model_dir(args.model)
    vs = [v for v in variants(args.memory_slots, args.policy) if v.name not in args.skip]
    for v in vs:  # a bad variant fails now, not after an hour of the others
        variant_config(lm.config, v, 1)
    log(f"{lm.name} W={lm.config.window} S={lm.config.sinks}; variants {', '.join(v.name for v in vs)}")
    state_bytes = args.state_mb << 20
    engine = None
    if getattr(args, "runtime", "torch") == "engine":
        refused = [v.name for v in vs if v.policy not in (None, "novelty")]
        if refused:
            raise MeasureError(f"--runtime engine keeps a memory by the novelty policy only, not {', '.join(refused)}; "
                               "use --policy novelty or --runtime torch")
        engine = {"weights": args.weights, "threads": args.threads}
    if args.cmd == "passkey":
        return run_passkey(lm, vs, args.lengths, args.trials, args.seed, filler=args.filler, state_bytes=state_bytes,
                           log=log, engine=engine)
    if args.cmd == "detail":
        return run_detail(lm, vs, args.multiples, args.trials, args.seed, state_bytes=state_bytes, log=log, engine=engine)
    source, docs = ppl_docs(lm, max(args.bands), args.docs, args.corpus)
    log(f"ppl on {len(docs)} documents of {max(args.bands)} tokens from {source}")
    return run_ppl(lm, vs, docs, args.bands, segment=args.segment, source=source, log=log)


if __name__ == "__main__":
    main()
