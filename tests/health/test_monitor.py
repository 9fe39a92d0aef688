"""The monitor: one finding per check, said again while it persists, the verdict, the stop request,
and rows that stand for several steps (metrics.jsonl's) counted as those steps."""

from __future__ import annotations

import logging

import pytest

from rlft.config.schema import HealthConfig, TrainConfig
from rlft.health import HealthMonitor
from tests.health.streams import healthy_row

FLAT = {"groups_zero_std": 1.0, "advantage/abs_mean": 0.0, "reward/std": 0.3, "reward/mean": 0.0}


class _Said(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def said():
    handler, log = _Said(), logging.getLogger("rlft-test-health-monitor")
    log.addHandler(handler)
    yield log, handler.lines
    log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


def test_no_signal_keeps_saying_so_while_it_lasts(said):
    log, lines = said
    monitor = HealthMonitor(HealthConfig(no_signal_patience=3, signal_window=10, repeat_every=5), log=log)
    for step in range(1, 21):
        monitor.observe_step(step, FLAT)
    no_signal = [line for line in lines if "[no_signal]" in line]
    # first at 3 (warning), at 8 (5 later), at 10 (unhealthy now), then every 5 steps: 15, 20
    assert [line.split(" ")[2].rstrip(":") for line in no_signal] == ["3", "8", "10", "15", "20"], no_signal
    assert "same reward" in no_signal[0] and "Knob: algorithm.temperature" in no_signal[0]
    assert monitor.verdict == "unhealthy" and monitor.findings[0].step == 3
    assert monitor.findings[0].last_step == 20 and monitor.summary()["verdict"] == "unhealthy"


def test_a_critic_that_still_gives_signal_is_no_false_alarm(said):
    """PPO/REINFORCE++ learn across prompts even when every group is flat."""
    log, lines = said
    monitor = HealthMonitor(HealthConfig(no_signal_patience=2), log=log, checks=["no_signal"])
    for step in range(1, 6):
        monitor.observe_step(step, dict(FLAT, **{"advantage/abs_mean": 0.4, "reward/std": 0.5}))
    assert lines == []
    for step in range(6, 9):  # one reward for the whole batch: nothing to learn, whatever the estimator
        monitor.observe_step(step, {"advantage/abs_mean": 0.4, "reward/std": 0.0, "reward/mean": 0.5})
    assert len(lines) == 1


def test_stop_on_no_signal_asks_to_stop_after_k_steps():
    monitor = HealthMonitor(HealthConfig(stop_on_no_signal=4))
    for step in range(1, 4):
        monitor.observe_step(step, FLAT)
        assert monitor.stop_reason() is None
    monitor.observe_step(4, FLAT)
    assert "no learning signal for 4 steps" in monitor.stop_reason()
    assert HealthMonitor().stop_reason() is None  # off by default


def test_rows_standing_for_several_steps_count_as_those_steps():
    """metrics.jsonl's rows average train.logging_interval steps: 3 rows of 10 flat steps are a 30-step streak."""
    monitor = HealthMonitor()
    for step in (10, 20, 30):
        monitor.observe_step(step, FLAT, span=10)
    finding = monitor.findings[0]
    # seen at step 10 (10 steps >= no_signal_patience), unhealthy from step 20 (all of the last 20 steps)
    assert (finding.check, finding.step, finding.severity) == ("no_signal", 10, "unhealthy")
    assert monitor.verdict == "unhealthy" and "(30 in a row now)" in finding.message


def test_sparse_healthy_rows_give_no_finding():
    monitor = HealthMonitor()
    for step in range(10, 101, 10):
        monitor.observe_step(step, healthy_row(step), span=10)
    assert monitor.findings == []


def test_a_recovery_is_logged_once_and_the_run_ends_healthy(said):
    log, lines = said
    log.setLevel(logging.INFO)  # a recovery is said at INFO, as rlft's own logger shows it
    monitor = HealthMonitor(log=log, task_reward="correct")
    for step in range(1, 41):
        monitor.observe_step(step, {**healthy_row(step), "reward/mean": 0.3 + 0.01 * step})
        if step in (10, 20, 30, 35):
            accuracy = {10: 0.6, 20: 0.3, 30: 0.61, 35: 0.62}[step]
            monitor.observe_eval(step, accuracy, 200, {"correct": accuracy, "format": 1.0})
    health = [line for line in lines if "[accuracy_falls]" in line]
    assert len(health) == 2 and "health, step 20 [accuracy_falls]: held-out accuracy fell to 30.0%" in health[0]
    assert health[1] == (
        "health, step 30 [accuracy_falls]: recovered: held-out accuracy is back to 61.0%, above its best before "
        "the fall (60.0% at step 10)"
    )
    summary = monitor.summary()
    assert summary["verdict"] == "healthy" and summary["findings"][0]["recovered_step"] == 30


def test_unknown_check_names_are_refused():
    with pytest.raises(ValueError, match="unknown health checks"):
        HealthMonitor(checks=["no_signal", "vibes"])


def test_train_watch_is_read_as_train_health():
    assert TrainConfig(watch={"dominance": 0.5}).health.dominance == 0.5
    with pytest.raises(ValueError, match="give train.health only"):
        TrainConfig(watch={}, health={})


def test_every_threshold_has_a_description():
    assert all(f.description for f in HealthConfig.model_fields.values())
