"""The one rule for "does this session remember X?", and the words it answers with.

`laplace probe session` and the TUI's /probe both reach it through
`agent.probes.session_check.check_state`; the chat types and the TUI import the words from
here, so every place prints the same verdict for the same evidence. Plain Python, no torch:
the TUI and `agent.chat.types` may import it.

The evidence is a forced choice: the expected answer ranked among same-shape distractors
after the question, on the state and on a blank state (the control), plus whether the
model's own greedy answer says it. Saying it is enough; otherwise ranking first with a
lift of at least `LIFT_NATS` over the blank state is remembering, coming close is weak.
"""

from __future__ import annotations

REMEMBERED = "REMEMBERED"
WEAK = "WEAK"
FORGOTTEN = "FORGOTTEN"
UNDETERMINED = "UNDETERMINED"  # the test cannot tell (too few distractors, or the blank state knows)
ANSWERED = "ANSWERED"  # a question with no expected answer: nothing to judge

LIFT_NATS = 1.0  # the state must raise the answer's log-prob by this much over a blank state
MIN_CANDIDATES = 5


def judge(*, said: bool, rank: int, n_candidates: int, lift: float, blank_rank: int) -> tuple[str, str]:
    """(verdict, reason) for one question with an expected answer.

    `said`: the greedy answer contains the expected one; `rank`/`blank_rank`: its 1-based
    rank among `n_candidates` on the state and on a blank state; `lift`: its log-prob on the
    state minus on the blank state, in nats."""
    n = n_candidates
    if n < MIN_CANDIDATES:
        return UNDETERMINED, f"only {n} distractors of the same shape and token length exist"
    if blank_rank == 1:
        return UNDETERMINED, "a blank state already ranks the expected answer first: no test of memory"
    if said:
        return REMEMBERED, "the model says it"
    if rank == 1 and lift >= LIFT_NATS:
        return REMEMBERED, f"top choice among {n} and {lift:+.2f} nats over a blank state"
    if rank <= 3 or lift >= LIFT_NATS:
        return WEAK, f"rank {rank} of {n}, {lift:+.2f} nats over a blank state, but not said"
    return FORGOTTEN, f"rank {rank} of {n}, {lift:+.2f} nats over a blank state"
