"""Running the app: the bearer token, the loopback rule, uvicorn on a bound socket, and
a shutdown that never closes the store under a scheduler still running.

Loopback is the default bind and needs no token (like llama.cpp's server and ollama).
Binding any other address exposes the sessions to the network, so it requires a bearer
token: generated on first use (`secrets.token_urlsafe`), stored 0600 beside the database,
and checked, with the Host and Origin rules, by the app's access middleware (`access.py`).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from pathlib import Path
from typing import Any, Callable

TOKEN_FILE = "serve-token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """The token stored at `path`, or a new one written there 0600; (token, created)."""
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
            return token, False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token, True


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port; read it back with `getsockname`)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def shut_down(scheduler: Any, store: Any, timeout: float = 30.0) -> bool:
    """Stop the scheduler, then close the store, but only once the scheduler's thread has
    ended: closing SQLite under a thread still writing would fail it mid-transaction (or
    worse). False when it is still running (the process is exiting; its daemon thread goes
    with it, and the next start's lease takeover marks its replies cancelled)."""
    if not scheduler.stop(timeout):
        return False
    store.close()
    return True


def make_server(app: Any, *, log_level: str = "warning", graceful_s: float = 5.0) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=graceful_s,
                            access_log=log_level in ("info", "debug"))
    return uvicorn.Server(config)


def serve(app: Any, sock: socket.socket, *, log_level: str = "warning",
          announce: Callable[[str], None] | None = None) -> None:
    """Run until SIGINT/SIGTERM; `announce` gets the URL once the socket is bound."""
    server = make_server(app, log_level=log_level)
    host, port = sock.getsockname()[:2]
    if announce is not None:
        announce(f"http://{f'[{host}]' if ':' in host else host}:{port}")
    server.run(sockets=[sock])
