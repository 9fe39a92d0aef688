"""One check for every reference a config holds, whichever route it came by: a submission, its
overrides, a run name, a tracker store, a built-in environment's files, and a resume with overrides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from rlft.config.loader import load_config
from rlft.config.references import references
from rlft.service.workspace import PathRefused, Workspace
from tests.conftest import write_jsonl
from tests.service.conftest import job_config, wait_for, write_config


@pytest.fixture
def outside(tmp_path) -> Path:
    """Files beside the workspace that a config must never reach; evil.py leaves a mark if it ever runs."""
    out = tmp_path / "outside"
    write_jsonl(out / "secret.jsonl", [{"prompt": "TOP-SECRET-ROW", "answer": "a"}])
    mark = out / "ran"
    (out / "evil.py").write_text(
        f"open({str(mark)!r}, 'w').write('x')\n"
        "def f(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    return out


def _every_reference_outside(outside: Path) -> list[dict]:
    """Configs whose every reference (but the run name, which the schema already refuses) points outside."""
    base = {
        "data": {
            "train_file": str(outside / "secret.jsonl"),
            "eval_file": f"../{outside.name}/secret.jsonl",
            "chat_template": str(outside / "t.jinja"),
        },
        "model": {"path": str(outside)},
        "train": {
            "output_dir": str(outside / "runs"),
            "tracking": {"mlflow_tracking_uri": f"sqlite:///{outside}/mlflow.db"},
        },
        "algorithm": {"name": "ppo", "advantage_estimator": "gae", "critic": {"model_path": str(outside)}},
        "reward": {
            "functions": [
                {"type": "custom", "function": f"{outside}/evil.py:f"},
                {"type": "model", "path": str(outside)},
                {"type": "judge", "model": str(outside)},
                {"type": "verifiers", "env": str(outside / "vf_env.py")},
            ]
        },
        "environment": {"class": "search", "kwargs": {"docs": str(outside / "secret.jsonl")}, "tools": ["os:system"]},
    }
    return [
        base,
        {**base, "environment": {"class": f"{outside}/evil.py:Env", "tools": []}},
        {**base, "environment": {"class": "os:system", "tools": []}},
        {**base, "environment": {"class": "openenv", "kwargs": {"url": "file:///etc/passwd"}}},
        {**base, "environment": {"class": "verifiers", "kwargs": {"env": "installed_vf_env"}}},
        {**base, "train": {**base["train"], "tracking": {"mlflow_tracking_uri": "postgresql://db.example/mlflow"}}},
        {**base, "train": {**base["train"], "tracking": {"mlflow_tracking_uri": f"file://{outside}/mlruns"}}},
    ]


def test_the_check_refuses_every_reference_that_leaves_the_workspace(tmp_path, outside):
    ws = Workspace(tmp_path / "ws")
    for raw in _every_reference_outside(outside):
        cfg = load_config(data=raw, check_files=False)
        refs = {dotted for dotted, _, _ in references(cfg)} - {"train.run_name"}
        problems = ws.check_config(cfg)
        assert {p.partition(":")[0] for p in problems} == refs, problems
    with pytest.raises(PathRefused, match="train.run_name"):
        ws.check_run_name("../up", "train.run_name")


def test_references_inside_the_workspace_pass(tmp_path):
    ws = Workspace(tmp_path / "ws")
    (ws.root / "data").mkdir()
    (ws.root / "r.py").write_text("def f(p, c, **k):\n    return [0.0] * len(c)\n")
    cfg = load_config(
        data={
            "data": {"train_file": "data/t.jsonl", "eval_file": str(ws.root / "data" / "e.jsonl")},
            "train": {
                "output_dir": "out",
                "run_name": "a/b",
                "tracking": {"mlflow_tracking_uri": "sqlite:///out/m.db"},
            },
            "reward": {
                "functions": [
                    {"type": "custom", "function": "r.py:f"},
                    {"type": "http", "url": "http://127.0.0.1:9/score"},
                ]
            },
            "environment": {"class": "openenv", "kwargs": {"url": "http://127.0.0.1:8000"}},
        },
        check_files=False,
    )
    assert ws.check_config(cfg) == []


def _escaping_submissions(ws: Path, outside: Path) -> list[dict]:
    rel = os.path.relpath(outside, ws)
    cfg = job_config()
    cfg["train"]["run_name"] = str(outside / "run")
    return [
        {"config": cfg},
        {"config_path": "configs/tiny.yaml", "overrides": [f"train.run_name={outside}/run"]},
        {"config_path": "configs/tiny.yaml", "overrides": [f"train.run_name={rel}/run"]},
        {"config_path": "configs/tiny.yaml", "overrides": [f"train.run_name={outside}/run"], "resume_from": "auto"},
        {"config_path": "configs/tiny.yaml", "overrides": [f"train.output_dir={outside}"]},
        {
            "config_path": "configs/tiny.yaml",
            "overrides": ["train.report_to=[mlflow]", f"train.tracking.mlflow_tracking_uri=sqlite:///{outside}/m.db"],
        },
        {"config_path": "configs/tiny.yaml", "overrides": [f"data.eval_file={outside}/secret.jsonl"]},
        {
            "config_path": "configs/tiny.yaml",
            "overrides": [f"reward.functions=[{{type: custom, name: correct, function: {outside}/evil.py:f}}]"],
        },
        {
            "config_path": "configs/tiny.yaml",
            "overrides": [f"environment={{class: search, kwargs: {{docs: {outside}/secret.jsonl}}}}"],
        },
    ]


def test_every_submission_route_refuses_an_escape_and_writes_nothing(server, workspace, outside):
    before = sorted(p.name for p in outside.iterdir())
    for body in _escaping_submissions(workspace, outside):
        r = httpx.post(server.url + "/api/train", json=body)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert "outside the workspace" in r.text or "below train.output_dir" in r.text, r.text
    assert httpx.get(server.url + "/api/jobs").json()["jobs"] == []
    assert sorted(p.name for p in outside.iterdir()) == before


def test_the_resume_route_checks_its_overrides_like_a_submission(server, workspace, outside):
    """Defect 1 of issue 35: a resume with overrides naming outside code and data was run."""
    c = server.client()
    job = c.submit(write_config(workspace, "long.yaml", job_config(steps=500, save_interval=1)))
    run = Path(job["run_dir"])
    wait_for(lambda: any((run / "checkpoints").glob("checkpoint-*/trainer_state.json")), what="a checkpoint")
    c.cancel(job["job_id"])
    assert c.wait(job["job_id"], timeout=120)["status"] == "cancelled"
    escapes = [
        [
            f"reward.functions=[{{type: custom, name: correct, function: {outside}/evil.py:f}}]",
            f"data.eval_file={outside}/secret.jsonl",
            "eval.after_training=true",
        ],
        [f"data.eval_file={outside}/secret.jsonl"],
        [f"train.tracking.mlflow_tracking_uri=file://{outside}/mlruns", "train.report_to=[mlflow]"],
    ]
    for overrides in escapes:
        r = httpx.post(f"{server.url}/api/jobs/{job['job_id']}/resume", json={"overrides": overrides})
        assert r.status_code == 422 and "outside the workspace" in r.text, (overrides, r.status_code, r.text)
    assert [j["id"] for j in httpx.get(server.url + "/api/jobs").json()["jobs"]] == [job["job_id"]]
    assert not (outside / "ran").exists()
    served = (
        json.dumps([json.loads(p.read_text()) for p in (run / "eval").glob("*.json")])
        if (run / "eval").is_dir()
        else ""
    )
    assert "TOP-SECRET-ROW" not in served
