"""The front door, in-process: Origin with its port, bodies without a length, files that link out of a job.

The app is built without its runner (no job process starts): a job row is made straight in the store,
with a run directory the test fills by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rlft.service.app import create_app
from rlft.service.security import Settings, origin_allowed
from rlft.service.store import NewJob

PORT = 8765


@pytest.fixture
def app_ws(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    app = create_app(Settings(workspace=str(ws), port=PORT, max_body_bytes=1000), start_runner=False)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}", raise_server_exceptions=True) as client:
        yield client, app.state.service.store, ws


def _job(store, ws: Path) -> tuple[str, Path]:
    job_id = store.new_id()
    run = ws / "outputs" / job_id
    (run / "eval").mkdir(parents=True)
    job_dir = ws / ".rlft" / "jobs" / job_id
    job_dir.mkdir(parents=True)
    store.create(job_id, NewJob("rl", "x: 1", None, str(job_dir), str(run)))
    return job_id, run


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret.jsonl"
    path.write_text('{"step": 1, "password": "hunter2"}\n')
    return path


# ---------------------------------------------------------------------- Origin


def test_an_origin_on_another_port_of_the_same_host_is_refused(app_ws):
    client, _, _ = app_ws
    body = {"config_path": "configs/missing.yaml"}
    for origin in (
        "http://127.0.0.1:1",
        "http://localhost:9999",
        "https://127.0.0.1:8765",
        "http://127.0.0.1",
        "http://127.0.0.1:8765.evil.example",
        "null",
    ):
        r = client.post("/api/train", json=body, headers={"origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert "cross-origin" in r.json()["detail"] and origin in r.json()["detail"]
    for origin in (f"http://127.0.0.1:{PORT}", f"http://localhost:{PORT}", f"http://127.0.0.1:{PORT}/"):
        r = client.post("/api/train", json=body, headers={"origin": origin})
        assert r.status_code == 422, (origin, r.text)  # past the door: the config itself is refused


def test_another_address_of_the_service_is_allowed_only_as_the_request_was_sent_to_it():
    s = Settings(workspace=".", port=8000, allowed_hosts=["rlft.example"])
    assert origin_allowed(s, "https://rlft.example", "rlft.example")  # a proxy in front that speaks https
    assert origin_allowed(s, "http://rlft.example:8080", "rlft.example:8080")
    assert not origin_allowed(s, "https://rlft.example:444", "rlft.example")
    assert not origin_allowed(s, "http://other.example:8000", "rlft.example:8000")
    assert not origin_allowed(s, "http://evil.example:9000", "evil.example:9000")  # a name it does not answer to
    assert origin_allowed(s, "http://localhost:9000", "localhost:9000")  # ssh -L 9000:127.0.0.1:8000
    assert not origin_allowed(s, "http://localhost:9001", "localhost:9000")
    wildcard = Settings(workspace=".", host="0.0.0.0", port=8000)
    assert origin_allowed(wildcard, "http://10.0.0.5:8000", "10.0.0.5:8000")
    assert not origin_allowed(wildcard, "http://10.0.0.5:1", "10.0.0.5:8000")


# ---------------------------------------------------------------------- bodies


def test_a_chunked_body_over_the_limit_is_413_with_a_clear_message(app_ws):
    client, _, _ = app_ws

    def chunks():
        yield b'{"config": {"model": {"path": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}}}'

    r = client.post("/api/train", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "over the limit of 1000 bytes" in r.json()["detail"]
    small = client.post(
        "/api/train",
        content=iter([b'{"config_path": ', b'"configs/missing.yaml"}']),
        headers={"content-type": "application/json"},
    )
    assert small.status_code == 422, small.text  # a chunked body under the limit reaches the route whole


# ---------------------------------------------------------------------- files that link out


def test_a_symlinked_metrics_file_is_403_on_the_stream_too(app_ws, secret):
    client, store, ws = app_ws
    job_id, run = _job(store, ws)
    (run / "metrics.jsonl").symlink_to(secret)
    for path in (f"/api/jobs/{job_id}/metrics", f"/api/jobs/{job_id}/metrics/stream"):
        r = client.get(path)
        assert r.status_code == 403, (path, r.text)
        assert "refused to serve metrics.jsonl" in r.json()["detail"] and "hunter2" not in r.text
        assert str(secret) not in r.text  # where the link points is not told


def test_every_file_route_refuses_a_link_out_of_the_job(app_ws, secret, tmp_path):
    client, store, ws = app_ws
    job_id, run = _job(store, ws)
    (run / "samples.jsonl").symlink_to(secret)
    (run / "eval" / "step-1.json").symlink_to(secret)
    job = store.get(job_id)
    Path(job.stderr_log).symlink_to(secret)
    for path, name in (
        (f"/api/jobs/{job_id}/samples", "samples.jsonl"),
        (f"/api/jobs/{job_id}/eval", "step-1.json"),
        (f"/api/jobs/{job_id}/logs?stream=stderr", "stderr.log"),
    ):
        r = client.get(path)
        assert r.status_code == 403, (path, r.text)
        assert f"refused to serve {name}" in r.json()["detail"] and "hunter2" not in r.text


def test_a_run_directory_that_is_itself_a_link_out_of_the_workspace_is_refused(app_ws, tmp_path):
    client, store, ws = app_ws
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "eval").mkdir(parents=True)
    (elsewhere / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (elsewhere / "eval" / "step-1.json").write_text(json.dumps({"step": 1, "accuracy": 1.0}))
    job_id, run = _job(store, ws)
    run.rename(ws / "moved")
    run.symlink_to(elsewhere, target_is_directory=True)
    for path in (f"/api/jobs/{job_id}/metrics", f"/api/jobs/{job_id}/eval", f"/api/jobs/{job_id}/metrics/stream"):
        r = client.get(path)
        assert r.status_code == 403 and "outside the workspace" in r.json()["detail"], (path, r.text)


def test_files_inside_the_job_are_still_served(app_ws):
    client, store, ws = app_ws
    job_id, run = _job(store, ws)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (run / "eval" / "step-2.json").write_text(json.dumps({"step": 2, "accuracy": 1.0, "samples": [1]}))
    (run / "eval" / "step-x.json").write_text("{}")  # a stray name is no crash
    assert client.get(f"/api/jobs/{job_id}/metrics").json()["records"] == [{"step": 1, "loss": 0.5}]
    results = client.get(f"/api/jobs/{job_id}/eval").json()["results"]
    assert {"step": 2, "accuracy": 1.0} in results
