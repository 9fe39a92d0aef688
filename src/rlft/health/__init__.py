"""Run health: one set of checks over a run's metric stream, live during training and after it.

    monitor = HealthMonitor(cfg.train.health, task_reward="correct", log=logger)
    monitor.observe_step(step, metrics)         # each training step: new findings are logged
    monitor.observe_eval(step, accuracy, n, rewards)  # each held-out evaluation (rewards: each one's mean)
    monitor.verdict                             # "healthy" | "warnings" | "unhealthy"

``rlft diagnose RUN_DIR`` (:mod:`rlft.health.report`) replays a finished run's ``metrics.jsonl`` and
``eval/step-N.json`` through the same monitor and writes a one-page report with plots.

A low layer: it reads configs and metric dicts, never a model, a trainer or the service.
"""

from rlft.health.checks import CHECKS, Check
from rlft.health.findings import EXIT_UNHEALTHY, SEVERITIES, VERDICTS, Finding, conclusion, verdict_of
from rlft.health.monitor import HealthMonitor

__all__ = [
    "CHECKS",
    "EXIT_UNHEALTHY",
    "SEVERITIES",
    "VERDICTS",
    "Check",
    "Finding",
    "HealthMonitor",
    "conclusion",
    "verdict_of",
]
