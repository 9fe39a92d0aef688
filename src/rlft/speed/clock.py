"""Where a training step's time goes: wall-clock seconds and work counts per phase.

Every expensive piece of a step marks itself with ``with phase("decode"):`` and says how much work
it did with ``count("decode_tokens", n)``; the job resets the clock at the start of a step and
reads it at the end (``time/<phase>`` and the work counts in metrics.jsonl, and the benchmark's
per-phase table). Phases are leaves: they never nest, so their sum plus "other" is the step.

The clock is one process-wide object because the phases live in layers that never see each other
(the rollout engine, the reward manager, the updater): passing a profiler through every call would
put a parameter on a dozen signatures for something that only observes. On a GPU each phase ends
with a synchronize, or its kernels would be billed to whichever phase waits next.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

#: The phases a step is split into, in the order the per-phase table prints them.
PHASES = (
    "weight_sync",
    "prefill",
    "decode",
    "environment",
    "reward",
    "reference",
    "old_logprobs",
    "critic",
    "policy",
    "optimizer",
)


class PhaseClock:
    """Seconds per phase and named work counters since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)
        self._open: str | None = None

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()
        self._open = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name``; inside another phase it counts to the outer one only."""
        if self._open is not None:  # e.g. a reward model's forward inside "reward"
            yield
            return
        self._open = name
        t0 = synced_now()
        try:
            yield
        finally:
            self.seconds[name] += synced_now() - t0
            self._open = None

    def count(self, name: str, amount: float) -> None:
        self.counts[name] += amount

    def snapshot(self, step_seconds: float) -> dict[str, float]:
        """``time/<phase>`` for every phase that ran, ``time/other`` (the rest of the step) and the counters."""
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out["time/other"] = max(step_seconds - sum(self.seconds.values()), 0.0)
        out.update({f"work/{k}": v for k, v in self.counts.items()})
        return out


TIMING_METRICS = ("step_seconds", "generation_seconds", "update_seconds", "tokens_per_s", "peak_mem_mb")


def is_timing(metric: str) -> bool:
    """True for the metrics that measure the machine rather than the run (they differ between two
    runs that are otherwise bit-identical)."""
    return metric in TIMING_METRICS or metric.startswith(("time/", "resources/")) or metric.endswith("_seconds")


def synced_now() -> float:
    """``time.perf_counter()`` once a GPU has run what was queued on it: a span's GPU work counts to it."""
    _sync()
    return time.perf_counter()


def _sync() -> None:
    import sys

    torch = sys.modules.get("torch")  # never import torch just to time something
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


CLOCK = PhaseClock()
phase = CLOCK.phase
count = CLOCK.count
