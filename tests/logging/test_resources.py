"""The resource monitor: samples on disk and in the metrics, a thread that cannot hurt training,
the headroom warning, and how an out-of-memory death is recorded."""

from __future__ import annotations

import json
import logging
import time

import pytest

from rlft.logging.resources import ResourceMonitor, diagnose_kill
from tests.conftest import read_jsonl


def test_samples_are_written_and_become_step_metrics(tmp_path):
    with ResourceMonitor(tmp_path / "resources.jsonl", interval=0.05) as monitor:
        monitor.step = 3
        time.sleep(0.4)
    rows = read_jsonl(tmp_path / "resources.jsonl")
    assert len(rows) >= 3
    assert rows[-1]["step"] == 3 and rows[-1]["rss_mb"] > 10 and rows[-1]["limit_mb"] > rows[-1]["available_mb"] > 0
    assert {"time", "rss_peak_mb", "system_used_percent", "cpu_percent", "threads"} <= set(rows[-1])
    metrics = monitor.step_metrics()
    assert metrics["resources/rss_mb"] == rows[-1]["rss_mb"] and "resources/available_mb" in metrics
    assert not monitor.alive


def test_a_failing_probe_ends_the_thread_with_a_warning(tmp_path, caplog):
    monitor = ResourceMonitor(tmp_path / "r.jsonl", interval=0.01)
    monitor.sample = lambda: 1 / 0
    with caplog.at_level(logging.WARNING, logger="rlft"), monitor:
        for _ in range(200):
            if not monitor.alive:
                break
            time.sleep(0.01)
        assert not monitor.alive
    assert "resource monitor stopped after 3 failed samples (ZeroDivisionError" in caplog.text


def test_low_headroom_warns_once_naming_the_first_knob(tmp_path, caplog):
    monitor = ResourceMonitor(tmp_path / "r.jsonl", first_knob="model.gradient_checkpointing=true")
    tight = {"available_mb": 50.0, "limit_mb": 1000, "rss_mb": 900.0}
    with caplog.at_level(logging.WARNING, logger="rlft"):
        monitor._record({**tight, "step": 1})
        monitor._record({**tight, "step": 2})
    assert caplog.text.count("memory is running out: 50 MB of 1000 MB left") == 1
    assert "--set model.gradient_checkpointing=true" in caplog.text


def test_training_goes_on_when_the_monitor_dies(tiny_config, monkeypatch):
    from rlft import Trainer

    monkeypatch.setenv("RLFT_RESOURCE_SECONDS", "0.01")
    monkeypatch.setattr(ResourceMonitor, "sample", lambda self: (_ for _ in ()).throw(OSError("no /proc")))
    tiny_config["train"]["max_steps"] = 2
    tiny_config["eval"].update(before_training=False, after_training=False)
    result = Trainer(config=tiny_config).train()
    assert result.steps == 2
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "completed"
    assert (
        "resource monitor stopped after 3 failed samples (OSError: no /proc)"
        in (result.run_dir / "train_log.log").read_text()
    )


def test_resources_reach_the_metrics_of_a_run(tiny_config, monkeypatch):
    from rlft import Trainer

    monkeypatch.setenv("RLFT_RESOURCE_SECONDS", "0.05")
    tiny_config["train"]["max_steps"] = 3
    tiny_config["eval"].update(before_training=False, after_training=False)
    run = Trainer(config=tiny_config).train().run_dir
    samples = read_jsonl(run / "resources.jsonl")
    assert samples and max(s["step"] for s in samples) >= 1
    rows = read_jsonl(run / "metrics.jsonl")
    assert all(r["resources/rss_mb"] > 0 for r in rows[1:])


def test_an_out_of_memory_error_is_recorded_with_the_peak_and_advice(tiny_config, monkeypatch):
    import torch

    from rlft import Trainer
    from rlft.rl.job import RLJob

    def boom(self, step):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(RLJob, "train_step", boom)
    tiny_config["eval"].update(before_training=False, after_training=False)
    trainer = Trainer(config=tiny_config)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.train()
    info = json.loads((trainer.run_dir.root / "run.json").read_text())
    assert info["status"] == "failed" and info["error_type"] == "oom"
    assert info["oom"]["kind"] == "cuda" and info["oom"]["peak_mb"] > 0 and info["oom"]["step"] == 0
    assert info["oom"]["advice"] == info["memory"]["if_out_of_memory"]


def _samples(path, available_mb: float, limit_mb: int = 1000) -> None:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "time": i,
                    "step": 7,
                    "rss_mb": limit_mb - available_mb,
                    "rss_peak_mb": limit_mb - available_mb,
                    "limit_mb": limit_mb,
                    "available_mb": available_mb,
                }
            )
            + "\n"
            for i in range(3)
        )
        + '{"half'
    )


def test_a_sigkill_with_memory_exhausted_is_an_oom(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"memory": {"if_out_of_memory": ["algorithm.micro_batch_size=8"]}}))
    _samples(tmp_path / "resources.jsonl", available_mb=20)
    found = diagnose_kill(tmp_path)
    assert found["error_type"] == "oom" and found["oom"]["peak_mb"] == 980 and found["oom"]["step"] == 7
    assert "OOM killer" in found["error"] and "--set algorithm.micro_batch_size=8" in found["error"]
    _samples(tmp_path / "resources.jsonl", available_mb=600)
    assert diagnose_kill(tmp_path) is None  # plenty left: someone else sent the SIGKILL
    assert diagnose_kill(tmp_path / "nothing-here") is None
