"""Session recall check ("does this session still remember X?"): ask a copy of a saved state.

Plain inputs only (state bytes, the question, the expected answer, where it was last
mentioned), so this module never touches the database; `agent/cli/probe.py` wires it to
the session store. The cost is one question on the state plus a blank-state control: it
does not depend on how long the history is. The caller's bytes are never modified (their
hash is checked before and after), and the state is parsed into fresh tensors.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.state import RecurrentState

from agent.probes import text
from agent.probes.engine import advance, ask, greedy_answer
from agent.probes.tasks import shaped_candidates
from agent.recall.horizon import model_half_lives
from agent.recall.verdicts import ANSWERED, judge

ANSWER_TOKENS = 48


@dataclass(frozen=True)
class Mention:
    """Where the expected detail was last mentioned, relative to the state asked."""

    turn_id: int
    turns_since: int  # turns after the mentioning turn
    tokens_since: int  # tokens folded in after the mention's last token


@dataclass
class SessionCheck:
    verdict: str  # one of the words in `verdicts` (ANSWERED when there is no expectation)
    answer: str  # the model's greedy answer from the copy
    question: str
    expect: str | None = None
    rank: int | None = None
    n_candidates: int | None = None
    logp: float | None = None
    blank_logp: float | None = None
    blank_rank: int | None = None
    reason: str = ""
    mention: Mention | None = None
    retention: dict[str, Any] = field(default_factory=dict)
    state_tokens: int = 0
    state_sha256: str = ""
    bytes_unchanged: bool = True

    @property
    def lift(self) -> float | None:
        return None if self.logp is None or self.blank_logp is None else self.logp - self.blank_logp

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lift"] = self.lift
        return d


def find_mention(turn_ids: Sequence[int], expect_ids: Sequence[Sequence[int]]) -> int | None:
    """Tokens of the turn after the last occurrence of any of `expect_ids` in it."""
    best = None
    for pat in expect_ids:
        n = len(pat)
        for i in range(len(turn_ids) - n, -1, -1):
            if list(turn_ids[i : i + n]) == list(pat):
                after = len(turn_ids) - (i + n)
                best = after if best is None else min(best, after)
                break
    return best


def predicted_retention(loaded: LoadedModel, tokens_since: int | None) -> dict[str, Any]:
    """The heads' half-lives (`model_half_lives`) and, given a distance, the share of a write left."""
    half, basis = model_half_lives(loaded)
    flat = [(h, li, hi) for li, row in enumerate(half) for hi, h in enumerate(row)]
    slow, sl, sh = max(flat)
    out: dict[str, Any] = {"slowest": {"layer": sl, "head": sh, "half_life": slow}, "basis": basis}
    if tokens_since is not None:
        out["slowest"]["retained"] = float(f"{math.exp(-math.log(2) * tokens_since / slow):.6g}") if slow > 0 else 0.0
        out["per_layer_max"] = [float(f"{max(math.exp(-math.log(2) * tokens_since / h) for h in row):.6g}") for row in half]
    return out


def check_state(
    loaded: LoadedModel,
    state: RecurrentState,
    question: str,
    *,
    expect: str | None = None,
    mention: Mention | None = None,
    seed: int = 0,
    answer_tokens: int = ANSWER_TOKENS,
) -> SessionCheck:
    """Ask `question` of `state` (the caller passes a copy it may lose) and, with `expect`,
    judge it by `verdicts.judge` against same-shape distractors and a blank-state control."""
    if expect is not None and not expect.strip():
        raise ValueError("--expect must not be empty")
    tok, tpl, model = loaded.tokenizer, loaded.template, loaded.model.eval()
    q_ids = tpl.message(tok, "user", question) + tpl.reply_prefix(tok)
    stops = tpl.stop_ids(tok)
    result = SessionCheck(verdict=ANSWERED, answer="", question=question, expect=expect, mention=mention,
                          state_tokens=state.n_tokens)
    if expect is None:
        result.answer = tok.decode(greedy_answer(model, state, q_ids, answer_tokens, stops))
    else:
        expect = expect.strip()
        rng = text.rng_of(seed, "session", question, expect)
        cands = shaped_candidates(expect, rng, tok.encode)
        ids = [tok.encode(c) for c in cands]
        a = ask(model, state, q_ids, ids, cands.index(expect), decode=tok.decode, answer=expect,
                greedy_tokens=len(ids[0]) + 8, stop_ids=stops)
        result.verdict, result.reason = judge(said=a.exact or a.contains, rank=a.rank, n_candidates=len(cands),
                                              lift=a.lift, blank_rank=a.blank_rank)
        result.answer = a.greedy
        result.rank, result.n_candidates = a.rank, a.n_candidates
        result.logp, result.blank_logp, result.blank_rank = a.logp, a.blank_logp, a.blank_rank
    result.retention = predicted_retention(loaded, mention.tokens_since if mention else None)
    return result


def check_session(
    loaded: LoadedModel,
    state_bytes: bytes,
    question: str,
    *,
    expect: str | None = None,
    fold_ids: Sequence[int] = (),
    mention: Mention | None = None,
    seed: int = 0,
) -> SessionCheck:
    """`check_state` on a saved state: parse a copy of the bytes, fold `fold_ids` (the turns
    since the snapshot, if any), ask, and confirm the caller's bytes are unchanged. Raises
    the runtime's `StateError` for unusable bytes."""
    if expect is not None and not expect.strip():
        raise ValueError("--expect must not be empty")
    digest = hashlib.sha256(state_bytes).hexdigest()
    state = RecurrentState.from_bytes(bytes(state_bytes), config=loaded.config, fingerprint=loaded.fingerprint,
                                      device=loaded.model.embed.weight.device)
    if fold_ids:
        _, state = advance(loaded.model.eval(), state, fold_ids)
    result = check_state(loaded, state, question, expect=expect, mention=mention, seed=seed)
    result.state_sha256 = digest
    result.bytes_unchanged = hashlib.sha256(state_bytes).hexdigest() == digest
    return result
