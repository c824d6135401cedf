"""Recall refresh inside a chat turn: candidates from the transcript, a block, its turn.

`ChatService.send` calls `RecallRefresh.plan` with the user's message before storing it.
The candidates are the branch's turns that the session's FTS5 index matches on the
message's words; `agent.recall.rule.build_block` (the one selection rule, shared with the
probe suites) keeps those past the model's recall horizon, within the token budget. The
block becomes its own `document` turn, stored with its exact token ids and
`{"kind": "recall"}` in its stats, just before the user's turn: a replay of the transcript
reads it like any other turn, so the state still equals the replay.

The horizon: `-o refresh_horizon N` when given, else `agent.recall.horizon.recall_horizon`
(the model card's measured recall, else the decay gates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent import timings
from agent.recall import rule
from agent.recall.options import RefreshOptions
from sessions import Session, SessionStore, Turn

if TYPE_CHECKING:  # the browsing half of the service imports `is_recall` without torch
    from agent.runtime.checkpoint import LoadedModel

ROLE = rule.BLOCK_ROLE
RECENT_TURNS = 64  # turns within the horizon looked at for statements that supersede faded ones


@dataclass(frozen=True)
class RecallPlan:
    """A recall block ready to store and fold: its text, token ids and what it repeats."""

    text: str
    token_ids: list[int]
    turn_ids: list[int]
    horizon: int


class RecallRefresh:
    def __init__(self, lm: LoadedModel, store: SessionStore) -> None:
        self.lm = lm
        self.store = store
        self._model_horizon: tuple[int, str] | None = None

    def model_horizon(self) -> tuple[int, str]:
        """(tokens, where the number comes from) for this model; computed once."""
        if self._model_horizon is None:
            from agent.recall.horizon import recall_horizon

            self._model_horizon = recall_horizon(self.lm)
        return self._model_horizon

    def horizon(self, opts: RefreshOptions) -> int:
        return opts.horizon or self.model_horizon()[0]

    def block_ids(self, text: str) -> list[int]:
        return self.lm.template.message(self.lm.tokenizer, ROLE, text)

    def plan(self, session: Session, message: str, opts: RefreshOptions) -> RecallPlan | None:
        """The recall block to fold before `message`, or None (refresh off, nothing faded
        and relevant). The message itself is not stored yet, so it is never a candidate."""
        with timings.phase("recall refresh: search"):
            return self._plan(session, message, opts)

    def _plan(self, session: Session, message: str, opts: RefreshOptions) -> RecallPlan | None:
        if not opts.on:
            return None
        words = rule.query_words(message)
        if not words:
            return None
        head = self.store.tree.get_turn(self.store.core.get_session(session.id).head_turn_id)
        horizon = self.horizon(opts)
        # Faded candidates from the index (only those, so recent chatter cannot crowd them
        # out of its best hits); the turns within the horizon, which may supersede them,
        # from the branch's tail.
        faded = self.store.browse.branch_matches(session.id, words, turn_id=head.id, limit=rule.MAX_CANDIDATES,
                                          ending_by=head.tokens_total - horizon - 1)
        recent = [t for t in self.store.tree.tail(session.id, RECENT_TURNS) if head.tokens_total - t.tokens_total <= horizon]
        candidates = [rule.Candidate(t.id, t.role, t.content, head.tokens_total - t.tokens_total)
                      for t in [*faded, *recent] if not is_recall(t)]
        block = rule.build_block(message, candidates, horizon=horizon, budget=rule.block_budget(self.lm.config, opts.tokens),
                                 encode=self.block_ids)
        if block is None:
            return None
        return RecallPlan(block.text, block.token_ids, [r.turn_id for r in block.chosen], horizon)

    def store_with_message(self, session: Session, plan: RecallPlan | None, text: str,
                           ids: list[int]) -> tuple[Turn | None, Turn]:
        """Store the block (if any) as a complete `document` turn at the head, then the
        user's message after it, in one transaction: both land, or neither."""
        with self.store.core.transaction():
            block = None
            if plan is not None:
                turn = self.store.turns.begin_turn(session.id, role=ROLE, content=plan.text, token_ids=plan.token_ids)
                stats = {"kind": "recall", "turns": plan.turn_ids, "horizon": plan.horizon, "tokens": len(plan.token_ids)}
                block = self.store.turns.commit_turn(turn.id, status="complete", token_ids=plan.token_ids, stats=stats)
            return block, self.store.turns.begin_turn(session.id, role="user", content=text, token_ids=ids)


def is_recall(turn: Turn) -> bool:
    return turn.role == ROLE and turn.stats.get("kind") == "recall"
