"""Synthetic metric streams for the health tests: a healthy run, and the same run broken on cue."""

from __future__ import annotations

from rlft.config.schema import HealthConfig
from rlft.health import HealthMonitor


def healthy_row(step: int) -> dict:
    """One step of a run that learns: a signal in most groups, finite numbers, nothing drifting."""
    return {
        "reward/mean": 0.3 + 0.005 * step,
        "reward/std": 0.4,
        "advantage/abs_mean": 0.7,
        "groups_zero_std": 0.25,
        "entropy": 1.0 - 0.002 * step,
        "completion_len/mean": 20.0,
        "truncation_rate": 0.05,
        "kl": 0.001 * step,
        "ratio/mean": 1.0,
        "clip_frac": 0.01,
        "grad_norm": 1.0 + 0.1 * (step % 4),
        "rollout/logprob_mismatch": 0.01,
        "tool/error_rate": 0.05,
        "episode/finish/env_error": 0.0,
        "episode/finish/tool_timeout": 0.0,
        "repetition/mean": 0.1,
        "answers/same_share": 0.25,
        "reward_share/correct": 0.8,
        "reward_share/format": 0.2,
        "reward/correct/mean": 0.2 + 0.005 * step,
        "loss": 0.01,
        "lr": 1e-5,
    }


def run(
    broken: dict | None = None,
    *,
    start: int = 30,
    steps: int = 60,
    only_at: bool = False,
    evals: list[tuple[int, float, int]] = (),
    **thresholds,
) -> HealthMonitor:
    """A monitor fed ``steps`` healthy steps, with ``broken``'s values from step ``start`` on (only at
    ``start`` if ``only_at``), and the evaluations (step, accuracy, prompts) at their steps."""
    monitor = HealthMonitor(HealthConfig(**thresholds), task_reward="correct")
    pending = sorted(evals)
    for step in range(1, steps + 1):
        while pending and pending[0][0] < step:
            monitor.observe_eval(*pending.pop(0))
        row = healthy_row(step)
        if broken and (step == start if only_at else step >= start):
            row.update(broken)
        monitor.observe_step(step, row)
    for ev in pending:
        monitor.observe_eval(*ev)
    return monitor


def found(monitor: HealthMonitor) -> dict:
    """check -> (first step, severity)."""
    return {f.check: (f.step, f.severity) for f in monitor.findings}
