"""The few numbers a sweep's summary shows per run: each main metric's final and best value.

"Best" depends on the metric: the most reward and accuracy, the least loss and KL (a run that
stayed nearest its reference). Only the metrics a run logged appear; the eval accuracy comes
from ``eval/step-N.json`` as ``eval/accuracy``.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlft.logging.plots import read_evals, read_metrics

# (metric, better): the columns of the summary, in this order, where any run has them.
MAIN_METRICS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "max"),
    ("loss", "min"),
    ("kl", "min"),
    ("accuracy", "max"),
    ("rewards/accuracy", "max"),
    ("eval_loss", "min"),
    ("eval/accuracy", "max"),
)
EVAL_KEYS = {"eval/accuracy": "accuracy"}  # summary key -> the key in eval/step-N.json


def run_metrics(run_dir: str | Path) -> tuple[dict[str, float], dict[str, float]]:
    """(final, best) of :data:`MAIN_METRICS` for one run directory; ({}, {}) when it logged nothing."""
    run_dir = Path(run_dir)
    try:
        records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    except OSError:
        records = []
    evals = read_evals(run_dir) if (run_dir / "eval").is_dir() else []
    final: dict[str, float] = {}
    best: dict[str, float] = {}
    for key, better in MAIN_METRICS:
        source, field = (evals, EVAL_KEYS[key]) if key in EVAL_KEYS else (records, key)
        values = [v for r in source if (v := _finite(r.get(field))) is not None]
        if values:
            final[key] = values[-1]
            best[key] = max(values) if better == "max" else min(values)
    return final, best


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
