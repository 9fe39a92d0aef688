"""The service's locks: tokens, path escapes, files outside a job, public binds, rate limits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlft.service.workspace import PathRefused, Workspace
from tests.cli.test_cli import _env
from tests.conftest import free_port, write_jsonl
from tests.service.conftest import PROMPTS, Server, job_config, write_config


def _create_token(ws: Path, name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rlft.cli.main", "serve", "--workspace", str(ws), "--create-token", name],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_tokens_are_required_once_one_exists_except_for_health(server, workspace):
    url = server.url
    assert httpx.get(url + "/api/jobs").status_code == 200  # loopback with no token yet: open
    token = _create_token(workspace, "alice")
    assert httpx.get(url + "/api/health").status_code == 200
    for method, path in (
        ("GET", "/api/jobs"),
        ("GET", "/api/jobs/x"),
        ("GET", "/api/jobs/x/logs"),
        ("GET", "/api/jobs/x/metrics"),
        ("POST", "/api/jobs/x/cancel"),
        ("POST", "/api/train"),
    ):
        r = httpx.request(method, url + path, json={} if method == "POST" else None)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, r.text)
        wrong = httpx.request(
            method, url + path, headers={"authorization": "Bearer rlft_wrong"}, json={} if method == "POST" else None
        )
        assert wrong.status_code == 401
    ok = httpx.get(url + "/api/jobs", headers={"authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.json() == {"jobs": []}
    job = server.client(token).submit("configs/tiny.yaml")
    assert server.client(token).job(job["job_id"])["submitted_by"] == "alice"
    server.client(token).cancel(job["job_id"])


def test_a_public_bind_without_a_token_is_refused(workspace):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlft.cli.main",
            "serve",
            "--workspace",
            str(workspace),
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "refusing to listen on 0.0.0.0" in out.stderr and "--create-token" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_public_bind_with_a_token_requires_it_everywhere(workspace):
    token = _create_token(workspace, "ci")
    srv = Server(workspace, "--host", "0.0.0.0")
    srv.url = f"http://127.0.0.1:{srv.port}"
    srv.start()
    try:
        assert httpx.get(srv.url + "/api/jobs").status_code == 401
        assert httpx.get(srv.url + "/api/jobs", headers={"authorization": f"Bearer {token}"}).status_code == 200
    finally:
        srv.stop()


@pytest.fixture
def outside(tmp_path) -> Path:
    """Files beside the workspace that a config must never reach."""
    out = tmp_path / "outside"
    write_jsonl(out / "train.jsonl", PROMPTS)
    (out / "evil.py").write_text("def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    (out / "config.yaml").write_text("kind: rl\n")
    return out


def _escapes(ws: Path, outside: Path, tiny_model_dir: Path) -> list[dict]:
    """Every submission below tries to leave the workspace one way or another."""
    (ws / "configs" / "link.yaml").symlink_to(outside / "config.yaml")
    (ws / "data" / "escape").symlink_to(outside, target_is_directory=True)
    (ws / "outlink").symlink_to(outside, target_is_directory=True)
    rel = os.path.relpath(outside, ws)
    bodies = [
        {"config_path": p}
        for p in (
            f"{rel}/config.yaml",
            str(outside / "config.yaml"),
            "configs/link.yaml",
            "%2e%2e/outside/config.yaml",
            "..%2foutside%2fconfig.yaml",
            "%252e%252e%252foutside",
            "..\\outside\\config.yaml",
            "/etc/passwd",
            "~/config.yaml",
        )
    ]

    def inline(section: str, key: str, value):
        cfg = job_config()
        cfg[section][key] = value
        return {"config": cfg}

    bodies += [
        inline("data", "train_file", f"{rel}/train.jsonl"),
        inline("data", "train_file", "data/escape/train.jsonl"),
        inline("data", "eval_file", str(outside / "train.jsonl")),
        inline("model", "path", str(tiny_model_dir)),
        inline("train", "output_dir", "../elsewhere"),
        inline("train", "output_dir", "outlink"),
        inline("train", "output_dir", str(outside)),
        inline("reward", "functions", [{"type": "custom", "function": f"{rel}/evil.py:f"}]),
        inline("reward", "functions", [{"type": "custom", "function": "os:system"}]),
        {"config": {**job_config(), "environment": {"tools": [str(outside / "evil.py") + ":f"]}}},
        {"config_path": "configs/tiny.yaml", "resume_from": f"{rel}"},
        {"config_path": "configs/tiny.yaml", "resume_from": "/etc"},
    ]
    return bodies


def test_every_path_escape_is_refused_and_nothing_is_written(server, workspace, outside, tiny_model_dir):
    before = sorted(p.name for p in outside.iterdir())
    for body in _escapes(workspace, outside, tiny_model_dir):
        r = httpx.post(server.url + "/api/train", json=body)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        assert r.status_code != 401
    assert httpx.get(server.url + "/api/jobs").json()["jobs"] == []
    jobs_dir = workspace / ".rlft" / "jobs"
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())
    assert not (workspace / "outputs").exists() and not (workspace.parent / "elsewhere").exists()
    assert sorted(p.name for p in outside.iterdir()) == before


def test_logs_and_metrics_are_read_only_inside_the_jobs_folders(server, workspace, outside):
    c = server.client()
    job = c.submit(write_config(workspace, "one.yaml", job_config(steps=1)))
    assert c.wait(job["job_id"], timeout=180)["status"] == "success"
    stdout = Path(job["stdout_log"])
    stdout.unlink()
    stdout.symlink_to(outside / "config.yaml")
    r = httpx.get(f"{server.url}/api/jobs/{job['job_id']}/logs", params={"stream": "stdout"})
    assert r.status_code == 403 and "kind: rl" not in r.text
    metrics = Path(job["run_dir"]) / "metrics.jsonl"
    metrics.unlink()
    metrics.symlink_to(outside / "train.jsonl")
    r = httpx.get(f"{server.url}/api/jobs/{job['job_id']}/metrics")
    assert r.status_code == 403 and "hello" not in r.text


def test_submissions_are_rate_limited_per_token(workspace):
    srv = Server(workspace, "--submissions-per-minute", "2").start()
    try:
        codes = [
            httpx.post(srv.url + "/api/train", json={"config_path": "configs/missing.yaml"}).status_code
            for _ in range(3)
        ]
        assert codes[:2] == [422, 422] and codes[2] == 429
    finally:
        srv.stop()


def test_cors_is_off(server):
    r = httpx.options(
        server.url + "/api/train", headers={"origin": "http://evil.example", "access-control-request-method": "POST"}
    )
    assert "access-control-allow-origin" not in r.headers


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(list("./\\%2e5cfoa~_-") + ["..", "%2e", "%2f", "%252e", "/etc", "\x00", "link"]), max_size=12
    ).map("".join)
)
def test_resolve_returns_a_path_inside_the_workspace_or_refuses(tmp_path_factory, raw):
    ws = Workspace(tmp_path_factory.getbasetemp() / "fuzz-ws")
    if not (ws.root / "link").exists():
        (ws.root / "link").symlink_to("/etc", target_is_directory=True)
    try:
        path = ws.resolve(raw)
    except PathRefused:
        return
    assert path == ws.root or ws.root in path.parents


def test_metrics_offsets_survive_a_rewrite_of_the_file(tmp_path):
    """A resume rewrites metrics.jsonl without the records after its checkpoint; a reader's old offset
    then no longer falls after a line end, and it is told to start over."""
    from rlft.logging.run_dir import truncate_jsonl
    from rlft.service.files import read_jsonl_from

    path = write_jsonl(tmp_path / "metrics.jsonl", [{"step": i, "loss": float(i)} for i in range(1, 6)])
    records, offset, reset = read_jsonl_from(path, (str(tmp_path),), 0)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5] and not reset
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # half a line: not returned yet
    assert read_jsonl_from(path, (str(tmp_path),), offset)[:2] == ([], offset)
    truncate_jsonl(path, 2)
    with open(path, "a") as f:
        f.write('{"step": 3, "loss": 30.0}\n')
    records, _, reset = read_jsonl_from(path, (str(tmp_path),), offset)
    assert reset and [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] == 30.0
