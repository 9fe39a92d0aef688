"""The service's front door: where it may listen, which Host names it answers, who may call it,
how big and how frequent requests may be.

The trust boundary: anyone holding a token can run the Python code that lives inside the workspace
(custom rewards, tools, environments: a config may name them), and nothing outside it. The service
never accepts a command line, only configs; it never reads or writes a file outside the workspace.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import deque
from dataclasses import dataclass, field

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


@dataclass
class Settings:
    """How one ``rlft serve`` runs; every default is the locked-down choice."""

    workspace: str
    host: str = "127.0.0.1"
    port: int = 8000
    db_url: str | None = None
    slots: int = 1
    grace_seconds: float = 30.0
    allowed_hosts: list[str] = field(default_factory=list)  # extra Host names (a proxy's, a DNS name)
    max_body_bytes: int = 1 << 20
    submissions_per_minute: int = 30
    poll_seconds: float = 0.5
    backend: str = "local"  # where job processes run: this machine, or "ray" (rlft.service.placement)
    ray_address: str | None = None  # ray.init's address for the ray backend (None: RAY_ADDRESS, else local)

    def host_names(self) -> set[str] | None:
        """The Host header names requests may carry (None: any, for a wildcard bind with none given).
        A browser page on another site that resolves its own name to this address (DNS rebinding)
        sends its own name and is refused."""
        names = {h.lower() for h in self.allowed_hosts}
        if is_loopback(self.host):
            return names | set(LOOPBACK_NAMES) | {self.host.lower()}
        if is_wildcard(self.host):
            return names or None
        return names | {self.host.lower()}


def host_of(header: str) -> str:
    """The name in a Host header, without the port ('[::1]:8000' -> '::1')."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class RateLimiter:
    """At most ``per_minute`` events per key in any sliding 60 s window."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> float | None:
        """None if allowed (and counted); else the seconds until it would be."""
        now = time.monotonic()
        with self._lock:
            q = self._events.setdefault(key, deque())
            while q and now - q[0] >= 60:
                q.popleft()
            if len(q) >= self.per_minute:
                return 60 - (now - q[0])
            q.append(now)
            return None


class BodyTooLarge(Exception):
    pass


def limit_body(app, max_bytes: int):
    """ASGI middleware: a request body over ``max_bytes`` (declared or streamed) is answered 413
    before the application reads it."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
            return await _too_large(send, max_bytes)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise BodyTooLarge
            return message

        try:
            await app(scope, counted, send)
        except BodyTooLarge:
            await _too_large(send, max_bytes)

    return middleware


async def _too_large(send, max_bytes: int) -> None:
    body = f'{{"detail": "request body over the limit of {max_bytes} bytes"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
