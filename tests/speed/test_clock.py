"""The per-phase clock: leaves that add up to the step, nesting billed to the outer phase."""

from __future__ import annotations

import pytest

from rlft.speed.clock import PhaseClock, is_timing


class FakeTime:
    """A clock that moves only when the test sleeps, so the sums are exact on any machine."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_phases_add_up_to_the_step_and_inner_phases_count_to_the_outer_one(monkeypatch):
    import rlft.speed.clock

    fake = FakeTime()
    monkeypatch.setattr(rlft.speed.clock, "time", fake)
    clock = PhaseClock()
    t0 = fake.perf_counter()
    with clock.phase("decode"):
        fake.sleep(0.02)
        with clock.phase("reward"):  # e.g. a reward model's forward inside the rollout
            fake.sleep(0.01)
    with clock.phase("reward"):
        fake.sleep(0.01)
    clock.count("decode_tokens", 16)
    clock.count("decode_tokens", 8)
    fake.sleep(0.01)
    snap = clock.snapshot(fake.perf_counter() - t0)
    assert snap["time/decode"] == pytest.approx(0.03)  # the nested reward is billed to decode ...
    assert snap["time/reward"] == pytest.approx(0.01)  # ... and not to reward a second time
    assert snap["time/other"] == pytest.approx(0.01)
    assert snap["work/decode_tokens"] == 24
    clock.reset()
    assert clock.snapshot(0.0) == {"time/other": 0.0}


def test_a_phase_that_raises_is_still_timed_and_closed():
    clock = PhaseClock()
    try:
        with clock.phase("reward"):
            raise ValueError("boom")
    except ValueError:
        pass
    with clock.phase("policy"):
        pass
    assert set(clock.seconds) == {"reward", "policy"}


def test_timing_metrics_are_told_apart_from_run_metrics():
    assert is_timing("time/decode") and is_timing("step_seconds") and is_timing("peak_mem_mb")
    assert is_timing("work/decode_capture_seconds")  # a work counter that is a duration
    assert not is_timing("work/decode_tokens") and not is_timing("reward/mean")
