"""The failure classifier: run.json's record first, else the exit code; what may be retried."""

from __future__ import annotations

import sys
import types

import pytest

from rlft.sweep.failures import FAILURE_CLASSES, NEVER_RETRIED, classify, parse_retry_on, retryable


def _failed(error_type: str) -> dict:
    return {"status": "failed", "error": "X: y", "error_type": error_type}


@pytest.mark.parametrize(
    "recorded", ["config_invalid", "data", "reward", "environment", "oom", "disk_full", "transient", "unknown"]
)
def test_the_runs_own_record_wins_over_the_exit_code(recorded):
    assert classify(_failed(recorded), 1) == recorded
    assert classify(_failed(recorded), 2) == recorded  # a DataError also exits 2: the record tells them apart


def test_record_aliases_and_strangers():
    assert classify(_failed("service_lost"), None) == "killed"
    assert classify(_failed("something_new"), 1) == "unknown"


@pytest.mark.parametrize(
    "info, code, expected",
    [
        ({}, 2, "config_invalid"),  # argparse or a config error before run.json existed
        ({"status": "running"}, -9, "killed"),
        ({"status": "running"}, 137, "killed"),
        ({"status": "running"}, -15, "killed"),
        ({"status": "running"}, 143, "killed"),
        ({"status": "starting"}, -6, "killed"),
        ({"status": "running"}, None, "killed"),  # died while nobody watched, without a record
        ({}, 1, "unknown"),
        ({}, None, "unknown"),
        ({"status": "completed"}, 3, "unknown"),
    ],
)
def test_no_record_means_the_exit_code(info, code, expected):
    assert classify(info, code) == expected
    assert expected in FAILURE_CLASSES


OOM = {"error_type": "oom", "error": "killed by the kernel's OOM killer (signal 9) at step 3"}


@pytest.mark.parametrize("verdict, expected", [(OOM, "oom"), (None, "killed"), ({"error_type": "other"}, "killed")])
def test_sigkill_is_oom_when_the_resource_log_says_memory_ran_out(monkeypatch, tmp_path, verdict, expected):
    module = types.ModuleType("rlft.logging.resources")
    module.diagnose_kill = lambda run_dir: verdict
    monkeypatch.setitem(sys.modules, "rlft.logging.resources", module)
    assert classify({"status": "running"}, -9, tmp_path) == expected
    assert classify({"status": "running"}, 137, tmp_path) == expected
    assert classify({"status": "running"}, -15, tmp_path) == "killed"  # only SIGKILL is the OOM killer's


def test_sigkill_with_real_resource_samples(tmp_path):
    import json

    from rlft.sweep.failures import kill_diagnosis

    samples = [{"step": 3, "rss_peak_mb": 900, "available_mb": 10, "limit_mb": 1000}]
    (tmp_path / "resources.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert kill_diagnosis(tmp_path) is not None  # the samples say the memory ran out (a skip would hide a break)
    assert classify({"status": "running"}, -9, tmp_path) == "oom"
    (tmp_path / "resources.jsonl").write_text(json.dumps({**samples[0], "available_mb": 800}) + "\n")
    assert classify({"status": "running"}, -9, tmp_path) == "killed"
    assert classify({"status": "running"}, -9, tmp_path / "missing") == "killed"


def test_a_diagnosis_that_raises_is_no_diagnosis(monkeypatch, tmp_path):
    module = types.ModuleType("rlft.logging.resources")
    module.diagnose_kill = lambda run_dir: 1 / 0
    monkeypatch.setitem(sys.modules, "rlft.logging.resources", module)
    assert classify({}, -9, tmp_path) == "killed"


def test_what_is_retried():
    assert parse_retry_on("transient") == ("transient",)
    assert parse_retry_on("transient, killed,transient") == ("transient", "killed")
    assert retryable("transient", ("transient",)) and not retryable("killed", ("transient",))
    for never in NEVER_RETRIED:
        assert not retryable(never, FAILURE_CLASSES)
        with pytest.raises(ValueError, match="never retried"):
            parse_retry_on(f"transient,{never}")
    with pytest.raises(ValueError, match="not a failure class"):
        parse_retry_on("flaky")
