"""Admitting a request: what it stores before anything is generated, as `ChatService` would.

Runs on the scheduler thread inside a savepoint, so a refused request leaves no rows: the
texts are checked and the options validated first; then a new session is created (its
system prompt folded and stored with its state), leased and given the request's earlier
messages, or a stored session is taken (lease, options, an interrupted reply folded, its
token chain checked, its state loaded); then the user's message and the recall block are
stored and the streaming reply row begun. The result is the scheduler's `Row`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from agent.chat.options import SessionOptions
from agent.chat.turns import TurnWriter, check_text
from agent.chat.types import ChatError, SessionBusyError, SessionNotFoundError, StateUnusableError
from agent.runtime.sampling import make_generator
from agent.runtime.tokenizer import StreamDecoder
from agent.serve.protocol import ApiError, Limits
from agent.serve.rows import Admitted, Job, Row


def api_error(exc: ChatError) -> ApiError:
    """A chat refusal as the HTTP answer it deserves."""
    if isinstance(exc, SessionNotFoundError):
        return ApiError(404, str(exc), code="session_not_found", param="session")
    if isinstance(exc, SessionBusyError):
        return ApiError(409, str(exc), code="session_in_use", param="session")
    if isinstance(exc, StateUnusableError):
        return ApiError(409, str(exc), code="state_unusable", param="session")
    return ApiError(400, str(exc))


def release(lease: Any) -> None:
    if lease is not None:
        try:
            lease.release()
        except Exception:  # the lease row may already be gone; the next acquire takes it
            pass


def admit(writer: TurnWriter, job: Job, *, given: Mapping[str, object], busy: set[int], limits: Limits) -> tuple[Row, Admitted]:
    """Store what `job` needs stored and return its row; raises ApiError or ChatError."""
    req = job.request
    turn_options = {**req.sampling, **({"max_new_tokens": req.max_tokens} if req.max_tokens else {})}
    for text, what in ((req.message, "message"), (req.system, "system prompt"), *((t, "message") for _, t in req.history)):
        check_text(text, what)
    try:
        SessionOptions().with_values({**given, **req.options, **turn_options})
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_option") from None
    lease = None
    try:
        created = req.session is None
        if created:
            options = SessionOptions().with_values({**given, **req.options})
            session, state = writer.create(system=req.system, name=req.name, options=options)
            folded_before = state.n_tokens  # the system prompt, folded for this request too
            lease = writer.lease(session)
            history = writer.store_history(session, req.history)
        else:
            session = writer.find(req.session)  # type: ignore[arg-type]
            if session.id in busy:
                raise ApiError(409, f"session {session.uid[:8]} is already answering a request; wait for its reply "
                                    "to finish, or leave out session to start a new one", code="session_in_use",
                               param="session")
            if session.model_id != writer.model_id:
                raise ApiError(409, f"session {session.uid[:8]} was made with model {session.model_id!r}; this server "
                                    f"runs {writer.model_id!r} (laplace serve -m {session.model_id})",
                               code="model_mismatch", param="session")
            opened = writer.open(session.id, given)
            session, lease, options, state = opened.session, opened.lease, opened.options, opened.state
            folded_before, history = 0, []
        stored = writer.store_message(session, req.message, options.refresh)
        reply = writer.begin_reply(session, lease)
    except BaseException:
        release(lease)
        raise
    sampling = options.with_values(turn_options).sampling
    if sampling.max_new_tokens > limits.max_tokens:  # a session's own option may ask for more
        sampling = replace(sampling, max_new_tokens=limits.max_tokens)
    prompt = [*history, *stored.recall_ids, *stored.user_ids, *reply.prefix]
    row = Row(job=job, session_id=session.id, session_uid=session.uid, lease=lease, reply=reply, prompt=prompt,
              state=state, opts=sampling, generator=make_generator(sampling.seed, "cpu"),
              decoder=StreamDecoder(writer.lm.tokenizer), prompt_tokens=folded_before + len(prompt), read=state.n_tokens)
    recall = None
    if stored.block is not None:
        recall = {"turn_id": stored.block.id, "tokens": stored.block.n_tokens, "text": stored.block.content}
    return row, Admitted(session.uid, stored.user.id, reply.turn.id, recall, created)
