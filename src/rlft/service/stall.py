"""Telling a stuck run from a live one.

A run's heartbeat comes from a thread of its own, so it stays fresh while a step hangs (a reward that
never returns, a dead collective). The heartbeat also carries the run's progress
(:class:`rlft.trainer.process.Heartbeat`): ``progress``, the time the last step completed or the
training phase began, and ``step_seconds``, the median time between steps so far. A running job
whose progress is older than ``max(10 min, 5 x that median)`` is reported as stalled: in the job API
(``stalled``), on the dashboard and once in the service log. Nothing is killed: a slow step may yet
end, and whether to cancel is the user's call.
"""

from __future__ import annotations

import time

FLOOR_SECONDS = 600.0  # never stalled sooner than this: a first step may compile, an eval may be long
MEDIAN_FACTOR = 5.0


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stall_limit(info: dict) -> float:
    """Seconds without progress after which the run counts as stalled."""
    median = _number(info.get("step_seconds"))
    return max(FLOOR_SECONDS, MEDIAN_FACTOR * median) if median is not None else FLOOR_SECONDS


def stalled(info: dict, now: float | None = None) -> str | None:
    """'stalled: no step for X min ...' for a running run (run.json's ``info``) whose progress is older
    than :func:`stall_limit`; None otherwise, and for a run that records no progress (an older rlft)."""
    progress = _number(info.get("progress"))
    if info.get("status") != "running" or progress is None:
        return None
    idle = (time.time() if now is None else now) - progress
    limit = stall_limit(info)
    if idle <= limit:
        return None
    step = info.get("progress_step")
    since = f"since step {step}" if step is not None else "since training began"
    median = _number(info.get("step_seconds"))
    usual = f"; the median step takes {_duration(median)}" if median is not None else ""
    return (
        f"stalled: no step for {_duration(idle)} ({since}{usual}); the process is alive but may be hung. "
        f"It is not stopped: cancel it if it does not recover"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
