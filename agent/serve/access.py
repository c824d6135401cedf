"""Who may reach the server: one ASGI middleware decides, before any handler runs.

Loopback alone is not a boundary: a web page the user visits can make the browser send
requests to 127.0.0.1 (DNS rebinding gives it a name of its own that resolves there, and a
plain form POST needs no CORS preflight). So every request passes, in order:

1. `Host` must name this server: a loopback name (`localhost`, `*.localhost`, a loopback
   address), the address it is bound to, or a name given with `--allow-host`. A rebound
   name fails here (llama.cpp's server and ollama check the same). Behind a wildcard bind
   (0.0.0.0, ::) any name reaches it, and the bearer token, required there, guards it;
2. a browser's `Origin` is refused unless `--allow-origin` names it (or is `*`); an allowed
   origin gets CORS headers and its preflight answered;
3. the bearer token, when one is configured (any non-loopback bind, or --require-token),
   on every path but the open ones (`OPEN_PATHS`), compared in constant time;
4. a body must be `application/json`: no browser sends that cross-origin without a
   preflight, which step 2 refuses.

A refusal is OpenAI's error object with one line naming the cause and the way out.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response

from agent.serve.protocol import ApiError

OPEN_PATHS = frozenset({"/health"})  # answered without the token (it says nothing about sessions)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def host_name(header: str) -> str:
    """The name in a Host header, without its port: '[::1]:8080' -> '::1', 'a.b:80' -> 'a.b'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header  # a bare IPv6 address (no port) or a plain name


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class AccessPolicy:
    bound: str = "127.0.0.1"  # the address the socket is bound to
    token: str | None = None
    allow_hosts: frozenset[str] = frozenset()
    allow_origins: frozenset[str] = frozenset()  # "*" allows any
    open_paths: frozenset[str] = field(default=OPEN_PATHS)

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name = host_name(header)
        ip = _ip(name)
        if name == "localhost" or name.endswith(".localhost") or (ip is not None and ip.is_loopback):
            return True
        bound = host_name(self.bound)
        bound_ip = _ip(bound)
        if bound_ip is not None and bound_ip.is_unspecified:
            return True  # a wildcard bind: every name of the machine; the token is required there
        return name == bound or (ip is not None and ip == bound_ip) or name in self.allow_hosts

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allow_origins or origin.rstrip("/").lower() in self.allow_origins

    def check(self, method: str, path: str, headers: Headers) -> None:
        """Raise the ApiError that refuses this request, if any (steps 1, 3 and 4)."""
        if not self.host_allowed(headers.get("host")):
            raise ApiError(403, f"this server does not answer to Host {headers.get('host', '')!r}; use "
                                "localhost or the address it is bound to (laplace serve --allow-host NAME to add one)",
                           code="host_not_allowed")
        if self.token is not None and path not in self.open_paths:
            scheme, _, value = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), self.token.encode()):
                raise ApiError(401, "a bearer token is required: send Authorization: Bearer TOKEN "
                                    "(the token is in $LAPLACE_HOME/serve-token)", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
        if method in BODY_METHODS:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                raise ApiError(415, f"the body must be JSON sent with Content-Type: application/json, got "
                                    f"{kind or 'no content type'!r}", code="unsupported_media_type")


class Access:
    """ASGI middleware enforcing an `AccessPolicy` (see the module docstring)."""

    def __init__(self, app: Any, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        try:
            if origin is not None and not self.policy.origin_allowed(origin):
                if not self.policy.host_allowed(headers.get("host")):
                    self.policy.check(scope["method"], scope["path"], headers)  # the Host refusal comes first
                raise ApiError(403, f"requests from the web page {origin!r} are refused (a page could otherwise "
                                    "reach your sessions); allow it with laplace serve --allow-origin ORIGIN",
                               code="origin_not_allowed")
            if origin is not None and scope["method"] == "OPTIONS":  # an allowed origin's preflight
                if not self.policy.host_allowed(headers.get("host")):
                    self.policy.check(scope["method"], scope["path"], headers)
                await Response(status_code=204, headers=self._cors(origin, preflight=True))(scope, receive, send)
                return
            self.policy.check(scope["method"], scope["path"], headers)
        except ApiError as err:
            await error_response(err)(scope, receive, send)
            return
        if origin is None:
            await self.app(scope, receive, send)
            return
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self._cors(origin).items()]

        async def with_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_cors)

    @staticmethod
    def _cors(origin: str, *, preflight: bool = False) -> dict[str, str]:
        out = {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
               "Access-Control-Expose-Headers": "X-Laplace-Session"}
        if preflight:
            out |= {"Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": "authorization, content-type", "Access-Control-Max-Age": "600"}
        return out
