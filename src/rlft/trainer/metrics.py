"""Metrics every kind of job reports: peak memory, and averaging over a logging interval."""

from __future__ import annotations

import math
import resource
import sys

import torch


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory if on GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


class MetricWindow:
    """Averages numeric metrics over the steps since the last log (maxima stay maxima).

    Each metric is averaged over the steps that reported it (e.g. entropy is absent from a step
    whose update had no row to compute)."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if _is_max(k):
                self._sums[k] = max(self._sums.get(k, -math.inf), v)
            else:
                self._sums[k] = self._sums.get(k, 0.0) + v
            self._counts[k] = self._counts.get(k, 0) + 1

    def flush(self) -> dict[str, float]:
        out = {k: (v if _is_max(k) else v / self._counts[k]) for k, v in self._sums.items()}
        self._sums, self._counts = {}, {}
        return out


def _is_max(key: str) -> bool:
    return key.endswith("/max") or key == "peak_mem_mb"
