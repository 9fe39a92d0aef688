"""Cancelling a job re-attached after a service restart: it stays running (cancel requested) until its
process has really exited, then ends ``cancelled`` with the exit code its run.json implies, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from rlft.service.runner import Runner, recorded_exit_code
from rlft.service.store import JobStore, NewJob, default_url
from tests.service.conftest import wait_for

# A stand-in for a training process: on SIGTERM it records ``cancelled`` in run.json like the trainer
# does, then takes a while to exit (a real run releases its model, joins its threads, flushes logs).
FAKE_RUN = r"""
import json, os, signal, sys, time
run = sys.argv[1]
def stop(signum, frame):
    with open(os.path.join(run, "run.json.tmp"), "w") as f:
        json.dump({"status": "cancelled", "signal": "SIGTERM", "pid": os.getpid()}, f)
    os.replace(os.path.join(run, "run.json.tmp"), os.path.join(run, "run.json"))
    time.sleep(float(sys.argv[2]))
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@contextmanager
def _started_job(ws: Path, exiting_seconds: float) -> Iterator[tuple[JobStore, str, Path, subprocess.Popen]]:
    """A running job of an earlier service, its process alive and not a child of the next runner; the
    process and the store are ended on the way out."""
    store = JobStore(default_url(ws))
    job_id = store.new_id()
    run = ws / "outputs" / "reattached"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "running", "step": 2}))
    store.create(job_id, NewJob("rl", "x: 1", None, str(ws / ".rlft" / "jobs" / job_id), str(run)))
    store.claim_next("old-service")
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_RUN, str(run), str(exiting_seconds)],
        start_new_session=True,
        env={**os.environ, "RLFT_JOB_ID": job_id},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    store.set_process(job_id, proc.pid, psutil.Process(proc.pid).create_time())
    try:
        yield store, job_id, run, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        store.close()


def test_a_reattached_job_is_cancelled_only_once_its_process_has_exited(tmp_path):
    with _started_job(tmp_path, exiting_seconds=2.0) as (store, job_id, run, proc):
        runner = Runner(store, tmp_path, echo=False)
        runner.reconcile()
        assert any("re-attached" in e for e in runner.events), runner.events
        store.request_cancel(job_id)
        runner.tick()
        wait_for(lambda: json.loads((run / "run.json").read_text())["status"] == "cancelled", 30, "the cancel record")
        runner.tick()
        job = store.get(job_id)
        assert proc.poll() is None  # still exiting
        assert job.status == "running" and job.cancel_requested and job.exit_code is None, job.as_dict()
        wait_for(lambda: proc.poll() is not None, 30, "the process to exit")
        runner.tick()
        job = store.get(job_id)
        assert job.status == "cancelled" and job.exit_code == 143, job.as_dict()
        assert "exit code 143 read from run.json" in job.summary and "could not be waited on" in job.summary


def test_a_restart_while_the_process_is_exiting_reattaches_it_instead_of_ending_the_job(tmp_path, monkeypatch):
    """An exiting process has released its memory: its environment reads empty. That is no proof it is
    gone (its start time still matches): the job stays running until it has exited."""
    with _started_job(tmp_path, exiting_seconds=3.0) as (store, job_id, run, proc):
        store.request_cancel(job_id)
        proc.send_signal(15)  # the old service sent SIGTERM, then stopped
        wait_for(lambda: json.loads((run / "run.json").read_text())["status"] == "cancelled", 30, "the cancel record")
        monkeypatch.setattr(psutil.Process, "environ", lambda self: {})
        runner = Runner(store, tmp_path, echo=False)
        runner.reconcile()
        job = store.get(job_id)
        assert job.status == "running" and job.exit_code is None, job.as_dict()
        wait_for(lambda: proc.poll() is not None, 30, "the process to exit")
        runner.tick()
        job = store.get(job_id)
        assert job.status == "cancelled" and job.exit_code == 143, job.as_dict()


def test_the_exit_code_a_final_run_json_implies():
    assert recorded_exit_code({"status": "completed"}) == 0
    assert recorded_exit_code({"status": "cancelled", "signal": "SIGINT"}) == 130
    assert recorded_exit_code({"status": "cancelled"}) == 143
    assert recorded_exit_code({"status": "failed", "error_type": "config_invalid"}) == 2
    assert recorded_exit_code({"status": "failed", "error_type": "disk_full"}) == 1
    assert recorded_exit_code({"status": "running"}) is None
    assert recorded_exit_code({"status": "failed", "exit_code": 3}) == 3
