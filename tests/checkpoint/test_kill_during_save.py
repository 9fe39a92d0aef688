"""A training process killed with SIGKILL in the middle of writing a checkpoint loses nothing that was complete:
`--resume auto` continues from the last complete checkpoint and the step numbers continue."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from tests import forked
from tests.cli.test_cli import _env, assert_ok, run_cli, write_config
from tests.conftest import read_jsonl

# The save is slowed down inside the child process only (by the test, not by a hook in rlft), so the kill
# reliably lands while checkpoint-2 is being written.
SLOW_SAVE = """
import sys, time
import rlft.atomic as atomic
_fsync = atomic.fsync_tree
def slow(root):
    _fsync(root)
    time.sleep(30)
atomic.fsync_tree = slow
from rlft.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _kill_once_exists(proc: forked.Forked, path) -> None:
    """SIGKILL ``proc`` shortly after ``path`` appears (the slowed save is then mid-write)."""
    try:
        deadline = time.time() + 120
        while not path.is_dir():
            assert proc.poll() is None and time.time() < deadline, f"training never got to {path.name}"
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_during_checkpoint_write_then_resume_auto(tmp_path, tiny_config):
    tiny_config["train"].update(max_steps=3, save_interval=1, run_name="killed")
    tiny_config["eval"].update(before_training=False, after_training=False)
    config = write_config(tmp_path, tiny_config)
    ckpts = tmp_path / "outputs" / "killed" / "checkpoints"
    proc = forked.start([sys.executable, "-c", SLOW_SAVE, "train", "--config", str(config)], cwd=tmp_path, env=_env())
    # checkpoint-1 sleeps 30 s before its rename; kill while it is still a temporary directory.
    _kill_once_exists(proc, ckpts / ".tmp-checkpoint-1")
    assert proc.returncode == -signal.SIGKILL
    assert not (ckpts / "checkpoint-1").exists()  # the half-written one never looks complete
    assert (ckpts / ".tmp-checkpoint-1").is_dir()

    # Nothing complete to resume from yet: a relaunch loop's --resume auto starts the run afresh in its own
    # directory, saying so; what the killed process logged is moved aside, not mixed in.
    out = run_cli(["train", "--config", str(config), "--resume", "auto"], tmp_path)
    assert_ok(out)
    assert "stopped before its first checkpoint; starting it afresh" in out.stdout + out.stderr, out.stdout
    first = ckpts.parent
    assert [r["step"] for r in read_jsonl(first / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(next(first.glob("superseded-*/metrics.jsonl")))] == [1]

    # Second attempt: let checkpoint-1 complete, kill during checkpoint-2.
    slow_second = SLOW_SAVE.replace("time.sleep(30)", "time.sleep(0 if root.name.endswith('-1') else 30)")
    proc = forked.start([sys.executable, "-c", slow_second, "train", "--config", str(config)], cwd=tmp_path, env=_env())
    second = tmp_path / "outputs" / "killed-2"  # a fresh run never mixes its files with the killed one's
    _kill_once_exists(proc, second / "checkpoints" / ".tmp-checkpoint-2")
    assert (second / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()
    assert not (second / "checkpoints" / "checkpoint-2").exists()

    tiny_config["train"]["run_name"] = second.name
    config = write_config(tmp_path, tiny_config)
    resumed = run_cli(["train", "--config", str(config), "--resume", "auto"], tmp_path)
    assert_ok(resumed)
    assert "resumed from" in resumed.stdout + resumed.stderr and "at step 1" in resumed.stdout + resumed.stderr
    assert [r["step"] for r in read_jsonl(second / "metrics.jsonl")] == [1, 2, 3]
    names = sorted(p.name for p in (second / "checkpoints").iterdir())
    assert names == ["checkpoint-1", "checkpoint-2", "checkpoint-3"], names  # the stale temp dir was replaced
    state = json.loads((second / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3
