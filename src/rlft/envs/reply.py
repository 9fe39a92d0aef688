"""What a request to an episode's environment (a worker, or an MCP server) answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    """ok: the request succeeded and ``value`` is its result; otherwise ``value`` is the error text
    (``"ValueError: ..."``). ``timed_out``: no reply within the timeout; ``crashed``: what was to
    answer died (a worker process: a segfault, an OOM kill, an ``os._exit``; an MCP server), not an
    exception the environment raised: a machinery failure; ``done``: the environment's ``done`` flag
    after the request."""

    ok: bool
    value: Any = None
    timed_out: bool = False
    done: bool = False
    crashed: bool = False
