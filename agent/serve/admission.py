"""Admitting a request: what it stores before anything is generated, as `ChatService` would.

Runs on the scheduler thread inside a savepoint, so a refused request leaves no rows, and
does bookkeeping only (`agent.chat.taking`), never model work: the texts are checked and the
options validated first; then a new session is created (its system prompt's ids stored,
owed to the state), leased and given the request's earlier messages, or a stored session is
taken (lease, options, an interrupted reply's ids stored, its token chain checked, its
newest snapshot loaded, the ids after it owed); then the user's message and the recall
block are stored and the streaming reply row begun. The result is the scheduler's `Row`,
whose prompt is every id its state must still read, for the segmented prefill.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from agent.chat.options import SessionOptions
from agent.chat.taking import AmbiguousSessionError, Recent, find_unlisted, release, start_session, take_session
from agent.chat.turns import TurnWriter, check_text
from agent.chat.types import ChatError, SessionBusyError, SessionNotFoundError, StateUnusableError
from agent.runtime.reply import ReplySampler
from agent.runtime.sampling import make_generator
from agent.serve.protocol import ApiError, ChatRequest, Limits
from agent.serve.rows import Admitted, Job, Row

MIN_SESSION_PREFIX = 8  # 32 bits: a prefix oracle would take billions of requests to walk


def api_error(exc: ChatError) -> ApiError:
    """A chat refusal as the HTTP answer it deserves."""
    if isinstance(exc, SessionNotFoundError):
        return ApiError(404, str(exc), code="session_not_found", param="session")
    if isinstance(exc, SessionBusyError):
        return ApiError(409, str(exc), code="session_in_use", param="session")
    if isinstance(exc, StateUnusableError):
        return ApiError(409, str(exc), code="state_unusable", param="session")
    return ApiError(400, str(exc))


def find_session(writer: TurnWriter, ref: str) -> Any:
    """The session `ref` names: a whole id or a prefix of at least `MIN_SESSION_PREFIX`
    characters. A prefix that matches several is refused without naming them: ids are
    the only thing that keeps one client out of another's sessions, so the server never
    lists them (the store's own message, for the CLI, does)."""
    if len(ref) < MIN_SESSION_PREFIX:
        raise ApiError(400, f"session must be the session id or at least its first {MIN_SESSION_PREFIX} characters "
                            "(a reply's X-Laplace-Session header holds the whole id)", code="invalid_session",
                       param="session")
    try:
        return find_unlisted(writer, ref)
    except AmbiguousSessionError as exc:
        raise ApiError(400, f"{exc} (a reply's X-Laplace-Session header holds the whole id)",
                       code="ambiguous_session", param="session") from None


def admit(writer: TurnWriter, job: Job, *, given: Mapping[str, object], busy: set[int], limits: Limits,
          recent: Recent | None = None) -> tuple[Row, Admitted]:
    """Store what `job` needs stored and return its row; raises ApiError or ChatError.
    Bookkeeping only: every id the model must read (the system prompt, turns stored after
    the newest snapshot, the message) is in the row's prompt, for the segmented prefill."""
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
            taken = start_session(writer, system=req.system, name=req.name,
                                  options=SessionOptions().with_values({**given, **req.options}))
            lease = taken.lease
            history = writer.store_history(taken.session, req.history)
        else:
            session = find_session(writer, req.session)  # type: ignore[arg-type]
            if session.id in busy:
                raise ApiError(409, f"session {session.uid[:8]} is already answering a request; wait for its reply "
                                    "to finish, or leave out session to start a new one", code="session_in_use",
                               param="session")
            if session.model_id != writer.model_id:
                raise ApiError(409, f"session {session.uid[:8]} was made with model {session.model_id!r}; this server "
                                    f"runs {writer.model_id!r} (laplace serve -m {session.model_id})",
                               code="model_mismatch", param="session")
            taken = take_session(writer, session.id, given, recent=recent)
            lease, history = taken.lease, []
        session, options, state = taken.session, taken.options, taken.state
        stored = writer.store_message(session, req.message, options.refresh)
        reply = writer.begin_reply(session, lease)
        tail = writer.prompt_tail(stored.user.id, reply.prefix)
    except BaseException:
        release(lease)
        raise
    sampling = options.with_values(turn_options).sampling
    if sampling.max_new_tokens > limits.max_tokens:  # a session's own option may ask for more
        sampling = replace(sampling, max_new_tokens=limits.max_tokens)
    prompt = [*taken.owed, *history, *stored.recall_ids, *stored.user_ids, *reply.prefix]
    sampler = ReplySampler(sampling, make_generator(sampling.seed, "cpu"), stop_ids=writer.lm.template.stop_ids(
        writer.lm.tokenizer), tokenizer=writer.lm.tokenizer, prompt_tail=tail)
    # A new session's system turn gets its state once the prompt has been read that far, as
    # `laplace chat` stores it: a reply stopped before its commit then leaves a session that
    # resumes from there, not one with no state at all.
    marks = [(len(taken.owed), taken.session.head_turn_id)] if created else []
    row = Row(job=job, session_id=session.id, session_uid=session.uid, lease=lease, reply=reply, prompt=prompt,
              state=state, sampler=sampler, prompt_tokens=len(prompt), read=state.n_tokens, marks=marks)
    recall = None
    if stored.block is not None:
        recall = {"turn_id": stored.block.id, "tokens": stored.block.n_tokens}
        if req.recall_text:  # the transcript text it holds, only when asked for
            recall["text"] = stored.block.content
    return row, Admitted(session.uid, stored.user.id, reply.turn.id, recall, created)


def prompt_tokens(lm: Any, req: ChatRequest) -> int:
    """The ids this request itself makes the model read (for `Limits.max_prompt_tokens`): a new
    session's system prompt and earlier messages, the message, the reply's prefix. Turns a
    continued session owes are not counted: earlier requests were held to the limit."""
    try:  # text that cannot be stored cannot be tokenized either: the same one-line refusal
        for text, what in ((req.message, "message"), (req.system, "system prompt"), *((t, "message") for _, t in req.history)):
            check_text(text, what)
    except ChatError as exc:
        raise ApiError(400, str(exc)) from None
    tok, template = lm.tokenizer, lm.template
    n = len(template.message(tok, "user", req.message)) + len(template.reply_prefix(tok))
    if req.session is None:
        n += len(template.message(tok, "system", req.system, first=True))
        for role, text in req.history:
            if role == "user":
                n += len(template.message(tok, "user", text))
            else:
                n += len(template.reply_prefix(tok)) + len(tok.encode(text)) + len(template.reply_suffix(tok))
    return n
