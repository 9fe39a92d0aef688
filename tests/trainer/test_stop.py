"""Stopping a run on request: SIGTERM (a job service's cancel) or Ctrl-C finishes the current step,
saves a checkpoint and records ``cancelled``; the process keeps a pid and heartbeat in run.json."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests import forked
from tests.cli.test_cli import _env, assert_ok, run_cli, write_config
from tests.conftest import read_jsonl


def _start(tmp_path, cfg) -> tuple[forked.Forked, object]:
    config = write_config(tmp_path, cfg)
    proc = forked.start(
        [sys.executable, "-m", "rlft.cli.main", "train", "--config", str(config)],
        cwd=tmp_path,
        env={**_env(), "RLFT_HEARTBEAT_SECONDS": "0.2"},
    )
    return proc, config


def _wait_for_step(proc, metrics, step: int) -> None:
    deadline = time.time() + 120
    while not (metrics.exists() and len(read_jsonl(metrics)) >= step):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "training never reached the step"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_after_the_step_with_a_checkpoint_then_resume_auto(tmp_path, tiny_config, sig):
    tiny_config["train"].update(max_steps=400, save_interval=1000, run_name="stopped")
    tiny_config["eval"].update(before_training=False, after_training=False)
    run = tmp_path / "outputs" / "stopped"
    proc, config = _start(tmp_path, tiny_config)
    _wait_for_step(proc, run / "metrics.jsonl", 2)
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "running" and info["pid"] == proc.pid
    beat = info["heartbeat"]
    time.sleep(0.6)
    assert json.loads((run / "run.json").read_text())["heartbeat"] > beat  # it beats while the run lives
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert "continue with --resume auto" in err and "Traceback" not in err
    info = json.loads((run / "run.json").read_text())
    step = info["step"]
    assert info["status"] == "cancelled" and info["signal"] == signal.Signals(sig).name and 2 <= step < 400
    assert (run / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()

    tiny_config["train"]["max_steps"] = step + 1
    resumed = run_cli(["train", "--config", str(write_config(tmp_path, tiny_config)), "--resume", "auto"], tmp_path)
    assert_ok(resumed)
    assert f"at step {step}" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, step + 2))
    assert json.loads((run / "run.json").read_text())["status"] == "completed"


def test_run_dir_is_used_exactly_and_never_reused(tmp_path, tiny_config):
    tiny_config["train"].update(max_steps=1, run_name=None)
    tiny_config["eval"].update(before_training=False, after_training=False)
    config = write_config(tmp_path, tiny_config)
    target = tmp_path / "jobs" / "job-1" / "run"
    assert_ok(run_cli(["train", "--config", str(config), "--run-dir", str(target)], tmp_path))
    assert (target / "checkpoints" / "checkpoint-1").is_dir() and not (tmp_path / "outputs").exists()
    again = run_cli(["train", "--config", str(config), "--run-dir", str(target)], tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr, again.stderr


def test_error_types_name_the_kind_of_failure():
    from rlft.errors import ConfigError, DataError, EnvironmentFailure, RewardError, UsageError, error_type

    assert error_type(ConfigError(["x: bad"])) == "config_invalid" and error_type(UsageError("u")) == "config_invalid"
    assert error_type(DataError("row 3")) == "data" and error_type(RewardError("r")) == "reward"
    assert error_type(EnvironmentFailure("e")) == "environment"
    assert error_type(MemoryError()) == "oom"
    assert error_type(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried")) == "oom"
    assert error_type(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert error_type(ValueError("something else")) == "unknown"


# The child stops itself once setup is done, so the stop lands before the first step every time.
STOP_BEFORE_FIRST_STEP = """
import os, signal, sys
from rlft.trainer.trainer import Trainer
_setup = Trainer.setup
def setup(self):
    _setup(self)
    os.kill(os.getpid(), signal.SIGTERM)
Trainer.setup = setup
from rlft.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_relaunch_loop_with_resume_auto_survives_a_stop_before_the_first_step(tmp_path, tiny_config):
    """A job runner that always relaunches with --resume auto: the first launch is stopped before any step
    (no checkpoint, and the message says so); the relaunch starts the run afresh in its directory."""
    tiny_config["train"].update(max_steps=2, save_interval=1000, run_name="loop")
    tiny_config["eval"].update(before_training=False, after_training=False)
    config = write_config(tmp_path, tiny_config)
    run = tmp_path / "outputs" / "loop"
    stopped = forked.run(
        [sys.executable, "-c", STOP_BEFORE_FIRST_STEP, "train", "--config", str(config), "--resume", "auto"],
        cwd=tmp_path,
        env=_env(),
        timeout=180,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "no checkpoint was written, as no step had completed" in stopped.stderr
    assert "checkpoint kept" not in stopped.stderr + stopped.stdout
    assert json.loads((run / "run.json").read_text())["status"] == "cancelled"
    assert not any((run / "checkpoints").iterdir())

    again = run_cli(["train", "--config", str(config), "--resume", "auto"], tmp_path)
    assert_ok(again)
    assert (
        "stopped before its first checkpoint; starting it afresh in the same directory" in again.stdout + again.stderr
    )
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert not (tmp_path / "outputs" / "loop-2").exists()
