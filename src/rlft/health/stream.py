"""The metric history the checks read: one row per observation, each covering one or more steps.

Live, the monitor sees every step (a row covers 1 step). Replayed from ``metrics.jsonl``, a row is the
mean of the ``train.logging_interval`` steps since the previous one, and covers them all; windows and
streaks are counted in steps, so the same thresholds hold for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def finite(value) -> float | None:
    """``value`` as a float if it is a finite number, else None (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Row:
    step: int
    span: int  # how many training steps this row stands for
    metrics: dict


@dataclass
class Stream:
    """The rows seen so far, with the window means the trend and rate checks compare."""

    window: int
    rows: list[Row] = field(default_factory=list)
    steps_covered: int = 0  # the rows' spans summed, kept as they come (every check asks, every step)

    def add(self, step: int, metrics: dict, span: int = 1) -> None:
        row = Row(step, max(int(span), 1), metrics)
        self.rows.append(row)
        self.steps_covered += row.span

    def _mean(self, rows: list[Row], key: str) -> float | None:
        """Span-weighted mean of ``key`` over ``rows`` (rows without a finite value skipped)."""
        pairs = [(v, r.span) for r in rows if (v := finite(r.metrics.get(key))) is not None]
        weight = sum(s for _, s in pairs)
        return sum(v * s for v, s in pairs) / weight if weight else None

    def _rows_covering(self, rows, steps: int) -> list[Row]:
        """The first rows of ``rows`` that together cover ``steps`` steps (at least one row)."""
        out, covered = [], 0
        for row in rows:
            out.append(row)
            covered += row.span
            if covered >= steps:
                break
        return out

    def recent(self, key: str, steps: int | None = None) -> float | None:
        """Mean of ``key`` over the last ``steps`` steps (default ``window``)."""
        return self._mean(self._rows_covering(reversed(self.rows), steps or self.window), key)

    def recent_share(self, flags: list[tuple[int, bool]], steps: int) -> float:
        """The share of the last ``steps`` steps whose flag is set; ``flags``: (span, flag) per row, oldest first."""
        covered = flagged = 0
        for span, flag in reversed(flags):
            take = min(span, steps - covered)
            covered, flagged = covered + take, flagged + (take if flag else 0)
            if covered >= steps:
                break
        return flagged / covered if covered else 0.0

    def start(self, key: str) -> float | None:
        """Mean of ``key`` over the first ``window`` steps."""
        return self._mean(self._rows_covering(self.rows, self.window), key)

    def window_ready(self, steps: int | None = None) -> bool:
        """Whether ``steps`` (default ``window``) steps have been seen: a rate over fewer is not yet one."""
        return self.steps_covered >= (steps or self.window)

    def trend_ready(self) -> bool:
        """Whether the run is long enough for a start and an end window that do not overlap."""
        return len(self.rows) >= 2 and self.steps_covered >= 2 * self.window
