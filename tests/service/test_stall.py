"""A hung step keeps the heartbeat fresh; the run's progress does not move, and the service says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from rlft.logging.run_dir import RunDirectory
from rlft.service.app import create_app
from rlft.service.runner import Runner, _Tracked
from rlft.service.security import Settings
from rlft.service.stall import stalled
from rlft.service.store import NewJob
from rlft.trainer.process import Heartbeat

MIN = 60.0


def _run_json(run: Path, **fields) -> None:
    run.mkdir(parents=True, exist_ok=True)
    now = time.time()
    info = {"status": "running", "pid": 1, "heartbeat": now, "step": 3, "total_steps": 10, **fields}
    (run / "run.json").write_text(json.dumps(info))


def test_stalled_after_ten_minutes_or_five_median_steps_whichever_is_longer():
    now = 1_000_000.0
    assert stalled({"status": "running", "progress": now - 9 * MIN}, now) is None
    verdict = stalled({"status": "running", "progress": now - 12 * MIN, "progress_step": 7}, now)
    assert verdict.startswith("stalled: no step for 12 min (since step 7") and "not stopped" in verdict
    slow = {"status": "running", "step_seconds": 4 * MIN, "progress_step": 7}  # 5 x 4 min = 20 min
    assert stalled({**slow, "progress": now - 15 * MIN}, now) is None
    assert "no step for 25 min" in stalled({**slow, "progress": now - 25 * MIN}, now)
    assert "the median step takes 4 min" in stalled({**slow, "progress": now - 25 * MIN}, now)
    for ended in ("completed", "failed", "cancelled", "starting"):
        assert stalled({"status": ended, "progress": now - 99 * MIN}, now) is None
    assert stalled({"status": "running"}, now) is None  # an older rlft records no progress: nothing to say


def test_the_job_api_shows_a_running_job_that_completes_no_step_as_stalled(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    app = create_app(Settings(workspace=str(ws), port=8765), start_runner=False)
    store = app.state.service.store
    ids = {}
    for name, age in (("hung", 30 * MIN), ("fine", 1 * MIN)):
        ids[name] = job_id = store.new_id()
        run = ws / "outputs" / name
        store.create(job_id, NewJob("rl", "x: 1", None, str(ws / ".rlft" / "jobs" / job_id), str(run)))
        store.claim_next("w")
        # the heartbeat is fresh in both: only the progress tells them apart
        _run_json(run, progress=time.time() - age, progress_step=3, step_seconds=20.0)
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        hung = client.get(f"/api/jobs/{ids['hung']}").json()
        assert hung["status"] == "running" and hung["stalled"].startswith("stalled: no step for 30 min"), hung
        assert abs(hung["last_progress"] - (time.time() - 30 * MIN)) < 60
        fine = client.get(f"/api/jobs/{ids['fine']}").json()
        assert fine["stalled"] is None and fine["last_progress"] is not None
        listed = {j["id"]: j for j in client.get("/api/jobs").json()["jobs"]}
        assert listed[ids["hung"]]["stalled"] and not listed[ids["fine"]]["stalled"]


def test_the_service_log_says_it_once_and_the_job_is_not_stopped(tmp_path):
    ws = tmp_path / "ws"
    app = create_app(Settings(workspace=str(ws), port=8765), start_runner=False)
    store = app.state.service.store
    job_id = store.new_id()
    run = ws / "outputs" / "hung"
    store.create(job_id, NewJob("rl", "x: 1", None, str(ws / ".rlft" / "jobs" / job_id), str(run)))
    store.claim_next("w")
    _run_json(run, progress=time.time() - 11 * MIN, progress_step=2)
    runner = Runner(store, ws, echo=False)
    tracked = _Tracked(job_id, 1)
    for _ in range(3):
        runner._note_stall(store.get(job_id), tracked)
    said = [e for e in runner.events if "stalled" in e]
    assert len(said) == 1 and said[0].startswith(f"job {job_id}: stalled: no step for 11 min"), runner.events
    _run_json(run, progress=time.time(), progress_step=3)
    runner._note_stall(store.get(job_id), tracked)
    assert runner.events[-1] == f"job {job_id}: progressing again"
    assert store.get(job_id).status == "running" and not store.get(job_id).cancel_requested


def test_the_heartbeat_carries_the_last_progress_and_the_median_step_time(tmp_path):
    run_dir = RunDirectory.at(tmp_path / "run")
    with Heartbeat(run_dir, seconds=0.05) as beat:
        started = run_dir.read_run_info()["progress"]
        for step in (1, 2, 3):
            time.sleep(0.1)
            beat.progress(step)
        time.sleep(0.3)  # a hung step: the heartbeat goes on, the progress stays
        info = run_dir.read_run_info()
    assert info["heartbeat"] > info["progress"] > started
    assert info["progress_step"] == 3 and 0.05 < info["step_seconds"] < 1.0
    assert info["heartbeat"] - info["progress"] >= 0.2


def test_the_start_of_training_is_written_at_once(tmp_path):
    run_dir = RunDirectory.at(tmp_path / "run")
    with Heartbeat(run_dir, seconds=3600) as beat:  # no beat comes during this test
        before = run_dir.read_run_info()["progress"]
        time.sleep(0.05)
        beat.progress()
        assert run_dir.read_run_info()["progress"] > before
