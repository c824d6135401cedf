"""OpenAI's chat-completions request, read into what the scheduler runs; errors as OpenAI shapes them.

Plain Python (no torch, no Starlette): every refusal is an `ApiError` with an HTTP status and
one line that names the cause and the way out, so the app turns it into
`{"error": {"message", "type", "param", "code"}}` and the server stays up.

What a request may say, and what laplace adds:

- `messages`: leading `system` (or `developer`) messages become a new session's system
  prompt; then user and assistant turns; the last message must be the user's. Content is a
  string or a list of `{"type": "text"}` parts.
- `session` (laplace): the id (or a unique prefix) of a stored session to continue from its
  saved state. Only the last user message is new; earlier messages are taken to be the
  stored history and are not read again (a client may resend the whole conversation, system
  prompt included, as chat front ends do). Without it, the request starts a new session.
- `laplace` (optional object): `name` for a new session, `options` (the `-o` keys of
  `laplace chat`, e.g. `{"refresh": false}`) stored with a new session; `recall_text: true`
  to get the recall block's transcript text back (by default only its turn id and size).
- sampling: `temperature`, `top_p`, `top_k`, `repetition_penalty`, `seed`, `stop`,
  `max_tokens` / `max_completion_tokens`; unset ones come from the session's options.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SYSTEM_ROLES = ("system", "developer")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_STOP_CHARS = 64  # characters per stop string


class ApiError(Exception):
    """A request the server refuses: HTTP status, one-line message, OpenAI's error type/code."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    @property
    def kind(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 403:
            return "permission_error"
        if self.status == 404:
            return "not_found_error"
        if self.status == 429:
            return "rate_limit_error"
        if self.status >= 500:
            return "server_error"
        return "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What the server accepts: body bytes (413), max_tokens (400), waiting requests (429),
    prompt tokens (400: the system prompt, earlier messages and the message of one request,
    the ids it makes the model read; like llama.cpp's n_ctx or vLLM's max_model_len, except
    that a session's state has no context to overflow: this bounds one request's work)."""

    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096
    max_queue: int = 64
    max_prompt_tokens: int = 8192

    def as_dict(self) -> dict[str, int]:
        return {"max_body_bytes": self.max_body_bytes, "max_tokens": self.max_tokens, "max_queue": self.max_queue,
                "max_prompt_tokens": self.max_prompt_tokens, "max_stop_strings": MAX_STOP,
                "max_stop_chars": MAX_STOP_CHARS}


@dataclass(frozen=True)
class ChatRequest:
    """A validated request: what to store, what to fold, how to sample."""

    model: str
    message: str  # the last user message: the new turn
    session: str | None = None  # continue this stored session
    system: str = ""  # a new session's system prompt
    history: tuple[tuple[str, str], ...] = ()  # a new session's earlier (role, text) messages
    name: str | None = None
    options: dict[str, object] = field(default_factory=dict)  # stored with a new session
    sampling: dict[str, object] = field(default_factory=dict)  # this turn only, -o keys
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    recall_text: bool = False  # send the recall block's text back (laplace.recall_text)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or a 400 naming what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8 text (bad byte at offset {exc.start}); re-encode it as UTF-8",
                       code="invalid_encoding") from None
    if not text.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return data


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"{where}: only text content parts are supported, got {kind!r}", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{where}: content must be a string or a list of text parts", param="messages")


def _messages(data: dict[str, Any]) -> list[tuple[str, str]]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a role and content", param="messages")
        role = m["role"]
        if role not in (*SYSTEM_ROLES, "user", "assistant"):
            raise ApiError(400, f"messages[{i}]: role {role!r} is not supported; use system, user or assistant",
                           param="messages")
        if m.get("tool_calls") or m.get("function_call"):
            raise ApiError(400, f"messages[{i}]: tool calls are not supported", param="messages")
        out.append(("system" if role in SYSTEM_ROLES else role, _text_of(m.get("content"), f"messages[{i}]")))
    return out


def _number(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok:
        raise ApiError(400, f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}", param=key)
    return kind(value)


def parse_request(data: dict[str, Any], *, served_model: str, limits: Limits) -> ChatRequest:
    """Validate an OpenAI chat-completions body against the served model and the limits."""
    model = data.get("model", served_model)
    if not isinstance(model, str) or model != served_model:
        raise ApiError(404, f"the model {model!r} does not exist here; this server runs {served_model!r} (GET /v1/models)",
                       code="model_not_found", param="model")
    n = data.get("n", 1)
    if n != 1:
        raise ApiError(400, "n must be 1: one reply per request (send the request again for another)", param="n")
    if data.get("tools") or data.get("functions"):
        raise ApiError(400, "tools and functions are not supported by this server", param="tools")
    if data.get("logprobs"):
        raise ApiError(400, "logprobs are not supported by this server", param="logprobs")
    messages = _messages(data)
    system_parts: list[str] = []
    while messages and messages[0][0] == "system":
        system_parts.append(messages.pop(0)[1])
    if not messages or messages[-1][0] != "user":
        raise ApiError(400, "the last message must be the user's: it is the one the reply answers", param="messages")
    if any(role == "system" for role, _ in messages):
        raise ApiError(400, "system messages must come first: a state cannot un-read what it has read, "
                            "so a new system prompt starts a new session", param="messages")
    message = messages[-1][1]
    if not message.strip():
        raise ApiError(400, "the last user message is empty; send some text", param="messages")
    session = data.get("session")
    if session is not None and (not isinstance(session, str) or not session.strip()):
        raise ApiError(400, "session must be a session id (or a unique prefix of one) as a string", param="session")
    ext = data.get("laplace") or {}
    if not isinstance(ext, dict):
        raise ApiError(400, "laplace must be an object: {name, options}", param="laplace")
    name = ext.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, "laplace.name must be a string", param="laplace.name")
    options = ext.get("options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "laplace.options must be an object of -o keys, e.g. {\"refresh\": false}", param="laplace.options")
    recall_text = ext.get("recall_text", False)
    if not isinstance(recall_text, bool):
        raise ApiError(400, "laplace.recall_text must be true or false", param="laplace.recall_text")
    if session is not None and (name is not None or options):
        raise ApiError(400, "laplace.name and laplace.options apply to a new session; a continued session "
                            "keeps its own (laplace sessions rename, /set in laplace chat)", param="laplace")

    sampling: dict[str, object] = {}
    for key in SAMPLING_FIELDS:
        value = _number(data, key, int if key in ("top_k", "seed") else float)
        if value is not None:
            sampling[key] = value
    stop = data.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
            raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP}", param="stop")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ApiError(400, f"each stop string may be at most {MAX_STOP_CHARS} characters on this server",
                           param="stop")
        sampling["stop"] = list(stops)
    max_tokens = _number(data, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _number(data, "max_tokens", int)
    if max_tokens is not None and not 1 <= max_tokens <= limits.max_tokens:
        raise ApiError(400, f"max_tokens must be between 1 and {limits.max_tokens} on this server, got {max_tokens}",
                       param="max_tokens", code="max_tokens_exceeded")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    stream_options = data.get("stream_options") or {}
    include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
    return ChatRequest(
        model=model, message=message, session=session.strip() if session else None,
        system="\n\n".join(system_parts), history=tuple(messages[:-1]) if session is None else (),
        name=name, options=dict(options), sampling=sampling, max_tokens=max_tokens, stream=stream,
        include_usage=include_usage, recall_text=recall_text,
    )
