"""The Ray backend: a sweep (and the runner under it) placing real ``rlft train`` runs on a local Ray instance,
their results in the same registry and run directories as local runs; and a clear error without Ray."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import read_jsonl
from tests.sweep.conftest import config, rows, sweep, write


@pytest.fixture
def local_ray(ws):
    """A local Ray instance of 2 CPUs, started after ``ws`` so its workers inherit the offline environment."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _gone(ray, job_id: str) -> bool:
    from rlft.service.ray_placement import NAMESPACE, actor_name

    try:
        ray.get_actor(actor_name(job_id), namespace=NAMESPACE)
    except ValueError:
        return True
    return False


def test_a_ray_sweep_of_two_tiny_configs_finishes_and_is_recorded_in_the_registry(ws, local_ray, capsys):
    exp = ws / "exp"
    write(exp, "a.yaml", config(num_threads=1))
    other = config(num_threads=1)
    other["algorithm"]["kl_coef"] = 0.05
    write(exp, "b.yaml", other)

    assert sweep("exp", "--out", "s", "--parallel", "2", "--backend", "ray", "--no-plots") == 0
    err = capsys.readouterr().err
    assert "2 runs in s (2 at a time on Ray)" in err and "[1/2] a: success" in err and "[2/2] b: success" in err
    runs = rows(ws / "s")
    assert [r["name"] for r in runs] == ["a", "b"]
    for row in runs:
        assert (row["status"], row["exit_code"], row["failure_class"], row["attempt"]) == ("success", 0, None, 1)
        assert row["pid"] and row["pid_started"] and row["started_at"] <= row["finished_at"]
        assert json.loads(row["metrics_final"])["loss"] is not None and "eval/accuracy" in json.loads(
            row["metrics_best"]
        )
        run = Path(row["run_dir"])
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
        assert json.loads((run / "run.json").read_text())["status"] == "completed"
        assert Path(row["stderr_log"]).is_file()
        assert _gone(local_ray, row["id"])  # each job's actor (and its CPU) was released when it ended
    assert (ws / "s" / "summary.csv").is_file()


def _job(store, ws: Path, name: str, cfg: dict):
    from rlft.service.store import NewJob

    job_id = store.new_id()
    job_dir = ws / ".rlft" / "jobs" / job_id
    job_dir.mkdir(parents=True)
    text = yaml.safe_dump(cfg, sort_keys=False)
    (job_dir / "config.yaml").write_text(text)
    for stream in ("stdout.log", "stderr.log"):
        (job_dir / stream).touch()
    return store.create(job_id, NewJob("rl", text, None, str(job_dir), str(ws / "outputs" / name)))


def _until(predicate, timeout: float, runner) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, runner.events
        runner.tick()
        time.sleep(0.2)


def test_a_ray_job_is_cancelled_like_a_local_one_and_an_oversized_one_is_refused(ws, local_ray):
    """Cancel: SIGTERM through the job's actor, the run saves a checkpoint and records ``cancelled``. A job
    asking for more CPUs than the cluster has fails at once (``config_invalid``), not queued forever."""
    from rlft.service.backends import make_placement
    from rlft.service.runner import Runner
    from rlft.service.store import JobStore, default_url

    store = JobStore(default_url(ws))
    runner = Runner(store, ws, slots=2, grace_seconds=60, echo=False, placement=make_placement("ray"))
    big = _job(store, ws, "big", config(num_threads=8))
    long = _job(store, ws, "long", config(steps=200, num_threads=1))
    runner.tick()
    refused = store.get(big.id)
    assert (refused.status, refused.error_type, refused.pid) == ("failed", "config_invalid", None)
    assert "needs 8 CPUs" in refused.summary and "2 CPUs" in refused.summary

    metrics = ws / "outputs" / "long" / "metrics.jsonl"
    _until(lambda: metrics.is_file() and metrics.read_text().strip(), 90, runner)  # training is under way
    pid = store.get(long.id).pid
    assert pid is not None and any("running as process" in e for e in runner.events)
    assert "ray" in " ".join(psutil.Process(pid).parent().cmdline())  # a child of the job's Ray actor, not ours
    store.request_cancel(long.id)
    _until(lambda: store.get(long.id).status != "running", 90, runner)
    job = store.get(long.id)
    assert job.status == "cancelled", (job.as_dict(), runner.events)
    assert json.loads((ws / "outputs" / "long" / "run.json").read_text())["status"] == "cancelled"
    assert list((ws / "outputs" / "long" / "checkpoints").iterdir())  # the SIGTERM let it save one
    assert _gone(local_ray, long.id)
    store.close()


def test_without_ray_the_backend_is_a_usage_error_naming_the_extra(ws, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    write(ws / "exp", "a.yaml", config())
    assert sweep("exp", "--out", "s", "--backend", "ray", "--no-plots") == 2
    assert "pip install 'rlft[ray]'" in capsys.readouterr().err
    assert not rows(ws / "s")  # nothing was queued

    from rlft.errors import UsageError
    from rlft.service.app import create_app
    from rlft.service.security import Settings

    with pytest.raises(UsageError, match=r"pip install 'rlft\[ray\]'"):
        create_app(Settings(workspace=str(ws), backend="ray"), start_runner=False)


def test_ray_address_without_the_ray_backend_is_refused(ws, capsys):
    write(ws / "exp", "a.yaml", config())
    assert sweep("exp", "--out", "s", "--ray-address", "auto") == 2
    assert "--ray-address is for --backend ray" in capsys.readouterr().err


def test_the_resources_a_job_reserves_come_from_its_config():
    from rlft.service.placement import LaunchRefused
    from rlft.service.ray_placement import config_demands, gpus_for
    from rlft.service.store import Job

    cfg = config(num_threads=3)
    cfg["model"]["device"] = "cpu"
    assert config_demands(Job(config_yaml=yaml.safe_dump(cfg), kind="rl")) == (3, "cpu")
    assert config_demands(Job(config_yaml=yaml.safe_dump(config()), kind="rl")) == (1, "auto")
    assert [gpus_for("cpu", 4), gpus_for("auto", 0), gpus_for("auto", 2), gpus_for("cuda", 1)] == [0, 0, 1, 1]
    with pytest.raises(LaunchRefused, match="cuda:0") as refused:
        gpus_for("cuda:1", 4)
    assert refused.value.error_type == "config_invalid"
