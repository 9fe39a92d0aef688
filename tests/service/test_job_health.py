"""The job view shows the run's health verdict and findings, read from its run.json (written by the
trainer at each logging step and at the end); the dashboard draws them."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from rlft.service.app import create_app
from rlft.service.security import Settings
from rlft.service.store import NewJob

STUCK = {
    "verdict": "unhealthy",
    "findings": [
        {
            "check": "no_signal",
            "step": 14,
            "severity": "unhealthy",
            "message": "no learning signal on 95% of the last 20 steps",
            "knob": "algorithm.temperature",
            "metrics": ["advantage/abs_mean"],
            "last_step": 60,
            "count": 9,
        }
    ],
}


def test_the_job_api_shows_each_runs_health_verdict(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    app = create_app(Settings(workspace=str(ws), port=8765), start_runner=False)
    store = app.state.service.store
    ids = {}
    for name, health in (
        ("stuck", STUCK),
        ("fine", {"verdict": "healthy", "findings": []}),
        ("old", None),
        ("odd", {"verdict": "great"}),
    ):
        ids[name] = job_id = store.new_id()
        run = ws / "outputs" / name
        run.mkdir(parents=True)
        store.create(job_id, NewJob("rl", "x: 1", None, str(ws / ".rlft" / "jobs" / job_id), str(run)))
        (run / "run.json").write_text(
            json.dumps({"status": "completed", "step": 60, **({"health": health} if health else {})})
        )
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        stuck = client.get(f"/api/jobs/{ids['stuck']}").json()
        assert stuck["health"] == "unhealthy" and stuck["health_findings"][0]["check"] == "no_signal"
        assert stuck["health_findings"][0]["knob"] == "algorithm.temperature"
        listed = {j["id"]: j for j in client.get("/api/jobs").json()["jobs"]}
        assert listed[ids["fine"]]["health"] == "healthy" and listed[ids["fine"]]["health_findings"] == []
        assert listed[ids["old"]]["health"] is None and listed[ids["odd"]]["health"] is None  # nothing claimed


def test_the_dashboard_draws_the_verdict_and_each_findings_knob():
    static = Path(__file__).resolve().parents[2] / "src" / "rlft" / "service" / "static"
    js, css = (static / "dashboard.js").read_text(), (static / "dashboard.css").read_text()
    assert '["health", job.health ? healthDetails(job) : null]' in js and "...healthBadge(j)" in js
    assert "Knob: ${f.knob}" in js and all(f".health-{v}" in css for v in ("healthy", "warnings", "unhealthy"))
