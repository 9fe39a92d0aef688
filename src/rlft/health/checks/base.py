"""The shape of a health check and the one registry of them (name -> check class)."""

from __future__ import annotations

from typing import ClassVar

from rlft.config.schema import HealthConfig
from rlft.health.findings import Finding
from rlft.health.stream import Stream

CHECKS: dict[str, type[Check]] = {}


def register(cls: type[Check]) -> type[Check]:
    """Add a check to :data:`CHECKS` under its ``name`` (each name once)."""
    if cls.name in CHECKS:
        raise ValueError(f"two health checks named {cls.name!r}")
    CHECKS[cls.name] = cls
    return cls


class Check:
    """One health check. It reads each observed row (``on_step``) and each held-out evaluation
    (``on_eval``) and returns a :class:`Finding` while the problem it looks for holds, else None; the
    monitor decides when to say it again. A few judge the run as a whole when it ends (``on_end``). A
    check keeps what state it needs (a streak, a best value).

    ``thresholds``: the run's ``train.health``; ``task_reward``: the reward that is the task (the
    others are shaping), or None."""

    name: ClassVar[str]
    severity: ClassVar[str] = "warning"
    knob: ClassVar[str]
    metrics: ClassVar[tuple[str, ...]] = ()

    def __init__(self, thresholds: HealthConfig, task_reward: str | None = None):
        self.t = thresholds
        self.task_reward = task_reward

    def on_step(self, step: int, metrics: dict, span: int, stream: Stream) -> Finding | None:
        return None

    def on_eval(
        self, step: int, accuracy: float, num_prompts: int | None, stream: Stream, rewards: dict | None = None
    ) -> Finding | None:
        """``rewards``: each reward's mean over the evaluation's greedy completions, where known."""
        return None

    def on_end(self, step: int, stream: Stream) -> Finding | None:
        """The run ended after ``step``, its last training step (a run that completed, or stopped itself):
        what only the whole run can say. Not called for a run cancelled or still going."""
        return None

    def solved(self, stream: Stream, window: int | None = None, metrics: dict | None = None) -> bool:
        """Whether the task reward (a 0-1 reward) rose from below ``solved`` at the start of the run to
        at least ``solved`` over the last ``window`` steps, or in ``metrics`` (one row) when given:
        groups then tie because their prompts are solved, the healthy end of a run, not a stall. A
        reward that was that high from the start taught nothing (a constant reward looks the same)."""
        if not self.task_reward:
            return False
        key = f"reward/{self.task_reward}/mean"
        value = metrics.get(key) if metrics is not None else stream.recent(key, window)
        start = stream.start(key)
        return value is not None and start is not None and start < self.t.solved <= value

    def recovered(self, step: int, message: str) -> Finding:
        """The report that the problem this check found earlier is gone (``message`` says how)."""
        return Finding(self.name, step, self.severity, message, self.knob, self.metrics, recovered_step=step)

    def found(
        self,
        step: int,
        message: str,
        *,
        severity: str | None = None,
        knob: str | None = None,
        metrics: tuple[str, ...] | None = None,
    ) -> Finding:
        return Finding(
            self.name,
            step,
            severity or self.severity,
            message,
            knob or self.knob,
            self.metrics if metrics is None else metrics,
        )
