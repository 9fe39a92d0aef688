"""A service that dies mid-job and starts again: no job is lost or run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from rlft.service.runner import Runner
from rlft.service.store import JobStore, NewJob, default_url
from tests.service.conftest import Server, job_config, wait_for, write_config

# The live job's reward: from its second batch on it waits for the file "open" beside it, so the job
# cannot finish before the restarted service has re-attached to it (a 12-step job on the tiny model
# could end during the restart, and the test then saw a finished job instead of a running one).
GATE = """
import pathlib, time

_calls = 0


def gated(prompts, completions, **columns):
    global _calls
    _calls += 1
    deadline = time.monotonic() + 200
    while _calls > 1 and not pathlib.Path(__file__).with_name("open").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return [float("a" in c) for c in completions]
"""


def _steps(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_killed_service_reattaches_a_live_job_and_marks_a_dead_one_service_lost(workspace):
    srv = Server(workspace, forking=False).start()  # re-attaching reads the job id from its environment
    c = srv.client()
    (workspace / "rewards").mkdir()
    (workspace / "rewards" / "gate.py").write_text(GATE)
    cfg = job_config(steps=12)
    cfg["reward"] = {"functions": [{"type": "custom", "function": "rewards/gate.py:gated", "name": "has_a"}]}
    live = c.submit(write_config(workspace, "live.yaml", cfg))
    run = Path(live["run_dir"])
    wait_for(lambda: _steps(run) >= 1, what="the first step")
    pid = c.job(live["job_id"])["pid"]
    srv.kill()  # the service dies; the job runs on in its own session
    assert os.kill(pid, 0) is None

    srv = Server(workspace, port=srv.port, forking=False).start()
    try:
        c = srv.client()
        assert "re-attached" in srv.log.read_text()
        assert c.job(live["job_id"])["status"] == "running" and _steps(run) == 1  # held at the gate
        (workspace / "rewards" / "open").touch()
        done = c.wait(live["job_id"], timeout=240)
        assert done["status"] == "success" and done["pid"] == pid, done  # the same process: not run twice
        assert [r["step"] for r in c.metrics(live["job_id"])[0]] == list(range(1, 13))

        doomed = c.submit(write_config(workspace, "doomed.yaml", job_config(steps=500)))
        wait_for(lambda: _steps(Path(doomed["run_dir"])) >= 1, what="the first step")
        doomed_pid = c.job(doomed["job_id"])["pid"]
        srv.kill()
        os.killpg(doomed_pid, signal.SIGKILL)  # and its job dies while nobody watches
        wait_for(lambda: not _alive(doomed_pid), what="the job process to end")
        srv = Server(workspace, port=srv.port, forking=False).start()
        job = srv.client().job(doomed["job_id"])
        assert job["status"] == "failed" and job["error_type"] == "service_lost", job
        assert "not watching" in job["summary"]
    finally:
        srv.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of a killed server's child still answers kill(0)
        return not open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return False


def test_reconcile_requeues_a_claimed_job_that_never_started_and_finishes_one_that_ended(workspace):
    store = JobStore(default_url(workspace))
    never = store.new_id()
    store.create(
        never,
        NewJob("rl", "x: 1", None, str(workspace / ".rlft" / "jobs" / never), str(workspace / "outputs" / "never")),
    )
    ended = store.new_id()
    run = workspace / "outputs" / "ended"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "completed", "pid": 999999, "step": 3}))
    store.create(ended, NewJob("rl", "x: 1", None, str(workspace / ".rlft" / "jobs" / ended), str(run)))
    assert store.claim_next("old-service").id == never
    assert store.claim_next("old-service").id == ended
    store.set_process(ended, 999999, 1.0)  # a process that is long gone

    Runner(store, workspace).reconcile()
    assert store.get(never).status == "pending"  # it never ran: queued again, not lost
    assert store.get(ended).status == "success"  # it finished while the service was down
    store.close()


def test_cancel_escalates_to_sigkill_after_the_grace_period(workspace):
    """A process that ignores SIGTERM is killed, with its process group, once the grace period is over."""
    import subprocess
    import time

    from rlft.service.runner import _Tracked

    store = JobStore(default_url(workspace))
    job_id = store.new_id()
    store.create(
        job_id,
        NewJob("rl", "x: 1", None, str(workspace / ".rlft" / "jobs" / job_id), str(workspace / "outputs" / "stubborn")),
    )
    store.claim_next("w")
    proc = subprocess.Popen(
        ["bash", "-c", "trap '' TERM; echo ready; sleep 60 & wait"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    # the SIGTERM must come after bash has set its trap: sent during bash's start-up it ends the
    # process at once (seen in a CI run: -15 where the grace period was still running)
    assert proc.stdout.readline().strip() == "ready"
    runner = Runner(store, workspace, grace_seconds=0.5)
    runner._tracked[job_id] = _Tracked(job_id, proc.pid, popen=proc)
    store.request_cancel(job_id)
    runner.tick()
    assert any("sent SIGTERM" in e for e in runner.events)
    time.sleep(0.3)
    runner.tick()
    assert proc.poll() is None  # it ignored SIGTERM and the grace period is not over
    time.sleep(0.5)
    runner.tick()
    proc.wait(timeout=10)
    proc.stdout.close()
    runner.tick()
    job = store.get(job_id)
    assert job.status == "cancelled" and job.exit_code == 137, job.as_dict()
    assert any("SIGKILL" in e for e in runner.events)
    store.close()


def test_a_job_the_oom_killer_ended_is_recorded_as_oom_with_advice(workspace):
    """SIGKILL with the run's last resource samples showing memory exhausted: failed / oom, and run.json
    gets the out-of-memory record (the kernel's OOM killer leaves the process no chance to write it)."""
    import subprocess

    from rlft.service.runner import _Tracked

    store = JobStore(default_url(workspace))
    job_id = store.new_id()
    run = workspace / "outputs" / "greedy"
    run.mkdir(parents=True)
    (run / "run.json").write_text(
        json.dumps({"status": "running", "memory": {"if_out_of_memory": ["model.gradient_checkpointing=true"]}})
    )
    (run / "resources.jsonl").write_text(
        "".join(
            json.dumps({"step": 4, "rss_mb": 990.0, "rss_peak_mb": 995.0, "limit_mb": 1000, "available_mb": 5.0}) + "\n"
            for _ in range(3)
        )
    )
    store.create(job_id, NewJob("rl", "x: 1", None, str(workspace / ".rlft" / "jobs" / job_id), str(run)))
    store.claim_next("w")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    runner = Runner(store, workspace)
    runner._tracked[job_id] = _Tracked(job_id, proc.pid, popen=proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    runner.tick()
    job = store.get(job_id)
    assert (job.status, job.error_type, job.exit_code) == ("failed", "oom", 137), job.as_dict()
    assert "OOM killer" in job.summary and "--set model.gradient_checkpointing=true" in job.summary
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["error_type"] == "oom"
    assert info["oom"]["peak_mb"] == 995.0 and info["oom"]["advice"] == ["model.gradient_checkpointing=true"]
    store.close()


def test_a_live_process_is_known_by_its_job_id_not_by_a_start_time_a_clock_step_moved():
    """A VM resumed or an NTP step moves psutil's create_time; the job's environment does not move."""
    from rlft.service.placement import alive

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
        env={**os.environ, "RLFT_JOB_ID": "job-a"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Until the child has exec'd, /proc shows the parent's environment (no job id): wait for it to speak.
        assert proc.stdout.readline().strip() == "up"
        started = psutil.Process(proc.pid).create_time()
        assert alive(proc.pid, started - 3600, "job-a") is not None  # the clock stepped an hour: still the job
        assert alive(proc.pid, started, "job-b") is None  # a reused pid running another job is not it
        assert alive(proc.pid, started - 3600) is None  # without a job id, the start time decides
        assert alive(proc.pid, started) is not None
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert alive(proc.pid, started, "job-a") is None  # ended
