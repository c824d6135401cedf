"""The HTTP face of the server: an OpenAI-compatible Starlette app over the scheduler.

Endpoints: `POST /v1/chat/completions` (JSON, or server-sent events with `stream`),
`GET /v1/models` (and `/v1/models/{id}`), `GET /health`, `GET /v1/laplace/stats` (the
scheduler's counters and the server's limits, for the serving pilot). Who may reach them is
decided before any handler runs, by one middleware (`access.py`: Host, Origin, bearer
token, JSON bodies). Every refusal is OpenAI's error object with a one-line message; an
unexpected exception is a 500 of the same shape, its details only in the server's log
(never sent: they can hold paths and internals), and the server stays up.

A request is answered once the scheduler has admitted it (its session is known and leased,
the user's message stored), so even a streamed reply carries its session id in the
`X-Laplace-Session` header; the last chunk (or the JSON reply) carries the `laplace`
object with the turn ids, status, recall block and timings. A client that goes away
cancels its reply: it is kept, marked cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.serve.access import Access, AccessPolicy, error_response
from agent.serve.admission import prompt_tokens
from agent.serve.protocol import ApiError, ChatRequest, Limits, parse_body, parse_request
from agent.serve.rows import Admitted, Delta, Failed, Finished, Handle
from agent.serve.scheduler import Scheduler

log = logging.getLogger("laplace.serve")


@dataclass(frozen=True)
class ServerInfo:
    model_id: str
    model: dict[str, Any]  # what /v1/models adds under "laplace"
    token: str | None = None  # a bearer token every request but the open paths must present
    stats: Callable[[], dict[str, Any]] | None = None  # extra counters (the compile log)
    bound: str = "127.0.0.1"  # the address the socket is bound to (the Host check)
    allow_hosts: frozenset[str] = frozenset()
    allow_origins: frozenset[str] = frozenset()

    def policy(self) -> AccessPolicy:
        return AccessPolicy(bound=self.bound, token=self.token, allow_hosts=self.allow_hosts,
                            allow_origins=self.allow_origins)


def completion_id(admitted: Admitted) -> str:
    """The OpenAI id of a reply: its session and assistant turn, the same in every chunk."""
    return f"chatcmpl-{admitted.session[:12]}-{admitted.assistant_turn_id}"


class EventStream(StreamingResponse):
    """Server-sent events; however the response ends (done, client gone, server stopping),
    a reply still running is cancelled."""

    def __init__(self, content: AsyncIterator[str], handle: Handle, headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
        self.handle = handle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.handle.finished:
                self.handle.cancel.set()


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _next(handle: Handle, gone: asyncio.Task[None]) -> Any:
    """The next event, or None when the client went away first."""
    get = asyncio.ensure_future(handle.get())
    done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    return None


def create_app(scheduler: Scheduler, info: ServerInfo) -> Starlette:
    limits: Limits = scheduler.limits
    started = int(time.time())

    def model_card() -> dict[str, Any]:
        return {"id": info.model_id, "object": "model", "created": started, "owned_by": "laplace", "laplace": info.model}

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        too_big = ApiError(413, f"the request body is larger than {limits.max_body_bytes:,} bytes, this server's "
                                "limit (laplace serve --max-body)", code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise too_big
        return bytes(body)

    def laplace_of(admitted: Admitted, fin: Finished) -> dict[str, Any]:
        return {"session": admitted.session, "created_session": admitted.created_session,
                "user_turn_id": admitted.user_turn_id, "assistant_turn_id": admitted.assistant_turn_id,
                "status": fin.status, "recall": admitted.recall, "tokens_folded": fin.tokens_folded,
                "timings": fin.timings}

    def usage_of(fin: Finished) -> dict[str, int]:
        return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
                "total_tokens": fin.prompt_tokens + fin.completion_tokens}

    def failed_reply(fin: Finished) -> ApiError:
        if fin.status == "cancelled":
            return ApiError(503, "the reply was cancelled (the server is stopping); what was written is stored, "
                                 "marked cancelled", code="cancelled")
        return ApiError(500, "generation failed; the partial reply is stored, marked error (the server's log "
                             "says why)", code="generation_failed")

    async def chat_completions(request: Request) -> Response:
        req = parse_request(parse_body(await read_body(request)), served_model=info.model_id, limits=limits)
        n = await run_in_threadpool(prompt_tokens, scheduler.writer.lm, req)  # tokenizing is not the loop's work
        if n > limits.max_prompt_tokens:
            raise ApiError(400, f"this request's prompt is {n:,} tokens; this server reads at most "
                                f"{limits.max_prompt_tokens:,} per request (laplace serve --max-prompt-tokens); "
                                "send less, or continue a session with only the new message",
                           code="context_length_exceeded", param="messages")
        handle = Handle()
        scheduler.submit(req, handle)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            first = await _next(handle, gone)
            if first is None:
                handle.cancel.set()
                return Response(status_code=499)
            if isinstance(first, Failed):
                return error_response(first.error)
            assert isinstance(first, Admitted)
            headers = {"X-Laplace-Session": first.session}
            if req.stream:
                gone.cancel()
                return EventStream(stream(req, first, handle), handle, headers)
            while True:
                event = await _next(handle, gone)
                if event is None:
                    handle.cancel.set()
                    return Response(status_code=499)
                if isinstance(event, Failed):  # the server stopped before it could finish: nothing more comes
                    return error_response(event.error)
                if isinstance(event, Finished):
                    break
            if event.status != "complete":
                err = failed_reply(event)
                body = err.body()
                body["laplace"] = laplace_of(first, event)
                return JSONResponse(body, status_code=err.status, headers=headers)
            return JSONResponse({
                "id": completion_id(first), "object": "chat.completion",
                "created": int(time.time()), "model": info.model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": event.text},
                             "finish_reason": event.finish_reason, "logprobs": None}],
                "usage": usage_of(event), "session": first.session, "laplace": laplace_of(first, event),
            }, headers=headers)
        finally:
            gone.cancel()

    async def stream(req: ChatRequest, admitted: Admitted, handle: Handle) -> AsyncIterator[str]:
        cid = completion_id(admitted)
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": info.model_id,
                    "session": admitted.session,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}

        yield sse(chunk({"role": "assistant", "content": ""}))
        while True:
            event = await handle.get()
            if isinstance(event, Delta):
                yield sse(chunk({"content": event.text}))
            elif isinstance(event, Failed):  # the server stopped before it could finish: nothing more comes
                yield sse(event.error.body())
                yield "data: [DONE]\n\n"
                return
            elif isinstance(event, Finished):
                if event.status == "complete":
                    yield sse(chunk({}, event.finish_reason, laplace=laplace_of(admitted, event)))
                else:
                    body = failed_reply(event).body()
                    body["laplace"] = laplace_of(admitted, event)
                    yield sse(body)
                if req.include_usage:
                    yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": info.model_id,
                               "session": admitted.session, "choices": [], "usage": usage_of(event)})
                yield "data: [DONE]\n\n"
                return

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request: Request) -> Response:
        if request.path_params["model"] != info.model_id:
            raise ApiError(404, f"the model {request.path_params['model']!r} does not exist here; this server runs "
                                f"{info.model_id!r}", code="model_not_found")
        return JSONResponse(model_card())

    async def health(request: Request) -> Response:
        ok = scheduler.alive
        body = {"status": "ok" if ok else "error", "model": info.model_id, **scheduler.load()}
        if not ok:  # what stopped it is in the server's log, not here
            body["error"] = "the scheduler is not running; see the server's log"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def stats(request: Request) -> Response:
        out = {"model": info.model_id, "widths": list(scheduler.widths), **scheduler.load(),
               "limits": limits.as_dict(), **scheduler.metrics.snapshot()}
        if info.stats is not None:
            out.update(info.stats())
        return JSONResponse(out)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"no endpoint {request.url.path}; see POST /v1/chat/completions, GET /v1/models, GET /health"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(ApiError(exc.status_code, message, headers=dict(exc.headers or {})))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error answering %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, "internal error (the server's log says what); the server is still up",
                                       code="internal_error"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not scheduler.alive:
            scheduler.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, scheduler.stop)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", one_model, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/laplace/stats", stats, methods=["GET"]),
        ],
        exception_handlers={ApiError: on_api_error, HTTPException: on_http_error, Exception: on_unexpected},
        middleware=[Middleware(Access, policy=info.policy())],
        lifespan=lifespan,
    )
