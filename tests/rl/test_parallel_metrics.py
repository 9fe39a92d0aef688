"""A data-parallel step's metrics: each process's averaged, the work counters summed, durations averaged."""

from __future__ import annotations

import pytest

from rlft.distributed.context import Dist
from rlft.rl.parallel import mean_over_processes


class TwoProcesses(Dist):
    """Rank 0 of two, whose other process logged ``other``: the collectives answered from both dicts."""

    def __init__(self, other: dict[str, float]):
        super().__init__(rank=0, world_size=2)
        self.other = other

    def gather_objects(self, obj):
        return [obj, sorted(self.other)]

    def sum_floats(self, *values):
        keys = sorted(set(self.mine) | set(self.other))
        theirs = [self.other.get(k, 0.0) for k in keys] + [float(k in self.other) for k in keys]
        return [a + b for a, b in zip(values, theirs)]

    def sum_by_key(self, values):
        self.mine = values
        return super().sum_by_key(values)


def test_work_is_summed_and_times_are_averaged_over_the_processes():
    mine = {"reward/mean": 0.5, "time/decode": 1.0, "work/decode_tokens": 100, "work/decode_capture_seconds": 0.2}
    theirs = {"reward/mean": 0.7, "time/decode": 3.0, "work/decode_tokens": 140, "work/decode_capture_seconds": 0.4}
    got = mean_over_processes(mine, TwoProcesses(theirs))
    assert got["work/decode_tokens"] == 240  # the run's decoded tokens
    assert got["work/decode_capture_seconds"] == pytest.approx(0.3)  # a duration: the mean process's, as time/*
    assert got["time/decode"] == 2.0 and got["reward/mean"] == pytest.approx(0.6)
