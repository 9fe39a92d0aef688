"""The service's front door: where it may listen, which Host names it answers, who may call it,
how big and how frequent requests may be.

The trust boundary: anyone holding a token can run the Python code that lives inside the workspace
(custom rewards, tools, environments: a config may name them), and nothing outside it. The service
never accepts a command line, only configs; it never reads or writes a file outside the workspace.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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


DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_and_port(header: str) -> tuple[str, int | None]:
    """A Host header's name and port (None when it names none): '[::1]:8000' -> ('::1', 8000)."""
    parts = urlsplit("//" + header.strip())
    try:
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return (parts.hostname or "").lower(), -1  # a port that is no number matches nothing


def origin_allowed(settings: Settings, origin: str, host_header: str) -> bool:
    """Whether a browser page at ``origin`` (scheme://name[:port]) is this service's own page.

    The port counts: a page served by any other program on the same machine (``http://127.0.0.1:1``)
    is another origin. Allowed: plain http on the port the service is bound to, under a name it answers
    to; or exactly the name and port the request itself was sent to (its Host, already checked against
    those names and ``allowed_hosts``): the page came from this service through whatever address the
    browser used, an SSH tunnel, a container's port mapping or a proxy in front that speaks https."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return False
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return False
    name = parts.hostname.lower()
    sent_name, sent_port = _host_and_port(host_header)
    names = settings.host_names()
    if port == settings.port and (names is None or name in names):
        return parts.scheme == "http"  # the service's own address, where it speaks plain http only
    answered = names is None or sent_name in names
    return answered and name == sent_name and port == (sent_port or DEFAULT_PORTS[parts.scheme])


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


def limit_body(app, max_bytes: int):
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 before the application sees it.

    A declared length is checked at once; a body sent without one (``Transfer-Encoding: chunked``) is
    read here, counting, up to the limit, and handed on whole only if it fits. (Raising from inside the
    application's own read would not do: FastAPI turns any error while reading a body into a 400.)"""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
            return await _too_large(send, max_bytes, "")
        first = await _read_body(receive, max_bytes)
        if first is None:
            return await _too_large(send, max_bytes, " (sent in chunks, without a Content-Length)")
        await app(scope, _replay(first, receive), send)

    return middleware


async def _read_body(receive, max_bytes: int) -> dict | None:
    """The whole request body as one ``http.request`` message (or the disconnect that ended it); None
    as soon as more than ``max_bytes`` arrived."""
    chunks, seen = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return message
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > max_bytes:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def _replay(first: dict, receive):
    """The application's ``receive``: the body read already, then the connection's own messages
    (a streaming response waits on them to learn that the client went away)."""
    pending = [first]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


async def _too_large(send, max_bytes: int, how: str) -> None:
    body = json.dumps({"detail": f"request body over the limit of {max_bytes} bytes{how}"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
