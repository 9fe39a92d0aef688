"""A full disk anywhere in a run (metrics, samples, an eval report, run.json itself): one clear error
naming the file and the free space, no traceback, no stray ``.tmp``, and a run.json that is whole:
``failed`` with ``error_type: disk_full`` where it could still be written, else its last complete
version. (Checkpoints: tests/checkpoint/test_disk_full.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import write_config
from tests.logging.full_disk import fill_disk


def _train(tmp_path: Path, tiny_config: dict, monkeypatch, capsys, full, evaluate: bool = False):
    from rlft.cli.main import main

    tiny_config["train"].update(max_steps=2, save_interval=100, run_name="full")
    tiny_config["eval"].update(before_training=False, after_training=evaluate)
    config = write_config(tmp_path, tiny_config)
    fill_disk(monkeypatch, full)
    code = main(["train", "--config", str(config)])
    monkeypatch.undo()
    return code, capsys.readouterr().err, tmp_path / "outputs" / "full"


def _strays(run: Path) -> list[str]:
    return [str(p.relative_to(run)) for p in run.rglob("*") if p.name.endswith(".tmp") or ".tmp-" in p.name]


@pytest.mark.parametrize(
    "name, evaluate", [("metrics.jsonl", False), ("samples.jsonl", False), ("step-2.json.tmp", True)]
)
def test_a_full_disk_while_logging_fails_the_run_with_one_clear_error(
    tmp_path, tiny_config, monkeypatch, capsys, name, evaluate
):
    code, err, run = _train(tmp_path, tiny_config, monkeypatch, capsys, lambda p: p.name == name, evaluate)
    shown = name.removesuffix(".tmp")
    assert code == 1, err
    assert "Traceback" not in err and "During handling" not in err, err
    assert f"{shown}: the disk is full (5 MB free)" in err and "--resume auto" in err, err
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["error_type"] == "disk_full", info
    assert shown in info["error"] and "5 MB free" in info["error"]
    assert _strays(run) == []


def test_when_run_json_itself_cannot_be_written_its_last_complete_version_stays(
    tmp_path, tiny_config, monkeypatch, capsys
):
    def full(path: Path) -> bool:  # the disk fills up once training has begun
        if path.name != "run.json.tmp" or not (path.parent / "run.json").exists():
            return False
        return json.loads((path.parent / "run.json").read_text()).get("status") == "running"

    code, err, run = _train(tmp_path, tiny_config, monkeypatch, capsys, full)
    assert code == 1, err
    assert "Traceback" not in err and err.count("error: ") == 1, err
    assert f"could not write {run / 'run.json'}: the disk is full (5 MB free)" in err
    info = json.loads((run / "run.json").read_text())  # whole JSON: never a truncated file
    assert info["status"] == "running"
    assert _strays(run) == []
    from rlft.logging.console import get_logger  # the run's log file is detached all the same

    assert not [h for h in get_logger().handlers if str(run) in str(getattr(h, "baseFilename", ""))]


def test_every_full_disk_is_the_disk_full_error_type():
    import errno

    from rlft.errors import CheckpointError, DiskFullError, RewardError, error_type

    assert error_type(DiskFullError("could not write x: the disk is full (5 MB free)")) == "disk_full"
    assert error_type(OSError(errno.ENOSPC, "No space left on device")) == "disk_full"
    assert (
        error_type(
            CheckpointError("could not write checkpoint checkpoint-2 to c: the disk is full (5 MB free). free space")
        )
        == "disk_full"
    )
    assert error_type(CheckpointError("could not write checkpoint checkpoint-2 to c: PermissionError: no")) == "unknown"
    wrapped = RewardError("reward crashed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert error_type(wrapped) == "disk_full"
