"""The job service driven over HTTP: a real ``rlft serve`` on loopback running tiny-model jobs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rlft.client import ServiceError
from tests.service.conftest import job_config, wait_for, write_config


def test_job_runs_pending_running_success_and_its_files_are_served(server, workspace):
    c = server.client()
    seen = []
    job = c.submit("./configs/tiny.yaml")
    assert job["status"] == "pending" and job["run_dir"].startswith(str(workspace))
    assert Path(job["stdout_log"]).parent == Path(job["stderr_log"]).parent  # the job's own folder
    wait_for(lambda: seen.append(c.job(job["job_id"])["status"]) or seen[-1] in ("success", "failed"), what="the end")
    info = c.job(job["job_id"])
    assert info["status"] == "success", (info, c.logs(job["job_id"], "stderr"))
    assert "running" in seen and info["exit_code"] == 0 and info["error_type"] is None
    assert info["run_dir"] == job["run_dir"] and info["step"] == 2
    assert info["started_at"] >= info["created_at"] and info["finished_at"] >= info["started_at"]

    records, offset = c.metrics(job["job_id"])
    assert [r["step"] for r in records] == [1, 2] and "reward/mean" in records[0]
    assert c.metrics(job["job_id"], offset) == ([], offset)  # polling from the offset gives only new lines
    assert "step" in c.logs(job["job_id"], "stderr") + c.logs(job["job_id"], "stdout")
    assert Path(job["stdout_log"]).read_text() != Path(job["stderr_log"]).read_text()  # kept apart
    groups = c.samples(job["job_id"])
    assert groups and len(groups[0]["completions"]) == 4  # one GRPO group side by side
    assert all("has_a" in comp["rewards"] for comp in groups[0]["completions"])
    evals = c.evaluations(job["job_id"])
    assert evals and evals[-1]["step"] == 2 and "accuracy" in evals[-1] and "samples" not in evals[-1]
    events = list(c.follow_metrics(job["job_id"]))  # the SSE stream replays everything, then ends
    assert [r["step"] for r in events] == [1, 2]
    listed = c.jobs("success")
    assert [j["id"] for j in listed] == [job["job_id"]]


def test_bad_config_is_422_with_the_dotted_problems_and_no_job(server, workspace):
    cfg = job_config()
    cfg["algorithm"]["learning_rat"] = 1e-3
    cfg["data"]["train_file"] = "data/missing.jsonl"
    path = write_config(workspace, "bad.yaml", cfg)
    with pytest.raises(ServiceError) as err:
        server.client().submit(path)
    assert err.value.status == 422
    text = "\n".join(err.value.problems)
    assert "algorithm.learning_rat" in text and "data.train_file" in text, err.value.problems
    assert server.client().jobs() == []
    assert not (workspace / ".rlft" / "jobs").exists() or not any((workspace / ".rlft" / "jobs").iterdir())


def test_inline_config_and_failed_job_is_classified(server, workspace):
    cfg = job_config()
    (workspace / "boom.py").write_text("def boom(prompts, completions, **kw):\n    raise ValueError('kaput')\n")
    cfg["reward"]["functions"] = [{"type": "custom", "function": "boom.py:boom"}]
    c = server.client()
    job = c.submit(config=cfg)
    done = c.wait(job["job_id"], timeout=180)
    assert done["status"] == "failed" and done["error_type"] == "reward", done
    assert "kaput" in done["summary"] and done["exit_code"] == 1


def test_cancel_running_job_leaves_a_checkpoint_then_resume_finishes_it(server, workspace):
    c = server.client()
    path = write_config(workspace, "long.yaml", job_config(steps=500, save_interval=1000))
    job = c.submit(path)
    run = Path(job["run_dir"])
    wait_for(
        lambda: (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 2,
        what="two steps",
    )
    assert c.cancel(job["job_id"])["cancel_requested"]
    done = c.wait(job["job_id"], timeout=120)
    assert done["status"] == "cancelled" and done["exit_code"] == 143, done
    step = json.loads((run / "run.json").read_text())["step"]
    assert (run / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    with pytest.raises(ServiceError) as err:
        c.cancel("nope")
    assert err.value.status == 404

    again = c.resume(job["job_id"], overrides=[f"train.max_steps={step + 1}"])
    assert again["run_dir"] == job["run_dir"]
    finished = c.wait(again["job_id"], timeout=180)
    assert finished["status"] == "success", c.logs(again["job_id"], "stderr")
    assert finished["resumed_job"] == job["job_id"] and finished["resume_from"].endswith(f"checkpoint-{step}")
    steps = [r["step"] for r in c.metrics(again["job_id"])[0]]
    assert steps == list(range(1, step + 2))
    with pytest.raises(ServiceError) as err:
        c.resume(again["job_id"])  # a successful job is not resumable
    assert err.value.status == 409


def test_cancel_pending_job_never_starts_it(server, workspace):
    c = server.client()
    first = c.submit(write_config(workspace, "slow.yaml", job_config(steps=500)))
    queued = c.submit("configs/tiny.yaml")
    assert c.cancel(queued["job_id"])["status"] == "cancelled"
    c.cancel(first["job_id"])
    c.wait(first["job_id"], timeout=120)
    job = c.job(queued["job_id"])
    assert job["status"] == "cancelled" and job["pid"] is None and not Path(job["run_dir"]).exists()


def test_two_slots_run_two_jobs_while_a_third_waits(workspace):
    from tests.service.conftest import Server

    srv = Server(workspace, "--slots", "2").start()
    try:
        c = srv.client()
        path = write_config(workspace, "slow.yaml", job_config(steps=500))
        ids = [c.submit(path, overrides=[f"train.seed={i}"])["job_id"] for i in range(3)]
        wait_for(lambda: [c.job(i)["status"] for i in ids[:2]] == ["running", "running"], what="two running")
        assert c.job(ids[2])["status"] == "pending"
        c.cancel(ids[0])
        wait_for(lambda: c.job(ids[2])["status"] == "running", what="the queued job to start in the freed slot")
        for i in ids:
            c.cancel(i)
        for i in ids:
            assert c.wait(i, timeout=120)["status"] == "cancelled"
    finally:
        srv.stop()


def test_malformed_and_oversize_bodies_and_foreign_requests_are_4xx(server, workspace):
    url = server.url + "/api/train"
    headers = {"content-type": "application/json"}
    assert httpx.post(url, content=b"{not json", headers=headers).status_code == 422
    assert httpx.post(url, content=b"[1, 2]", headers=headers).status_code == 422
    assert httpx.post(url, json={"config_path": "configs/tiny.yaml", "surprise": 1}).status_code == 422
    big = json.dumps({"config": {"model": {"path": "x" * (2 << 20)}}}).encode()
    assert httpx.post(url, content=big, headers=headers).status_code == 413
    # a form another site posts (no JSON content type), a foreign Origin, a rebinding Host
    assert (
        httpx.post(
            url, content=b'{"config_path": "configs/tiny.yaml"}', headers={"content-type": "text/plain"}
        ).status_code
        == 415
    )
    assert (
        httpx.post(
            url, json={"config_path": "configs/tiny.yaml"}, headers={"origin": "http://evil.example"}
        ).status_code
        == 403
    )
    assert httpx.get(server.url + "/api/jobs", headers={"host": "evil.example"}).status_code == 421
    assert server.client().jobs() == []


def test_an_sft_job_runs_as_its_own_kind(server, workspace):
    """kind: sft in the config makes the job an `rlft sft` process; its loss curve is served."""
    from rlft.models.tiny import build_tiny_model_dir
    from tests.conftest import write_jsonl
    from tests.sft.conftest import calculator_chat

    build_tiny_model_dir(workspace / "models" / "chatml", chat_format="chatml")
    rows = [calculator_chat(a, b) for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (8, 1)]]
    write_jsonl(workspace / "data" / "chats.jsonl", rows)
    cfg = {
        "kind": "sft",
        "model": {"path": "models/chatml", "dtype": "fp32"},
        "data": {"train_file": "data/chats.jsonl", "messages_field": "messages", "max_length": 1800},
        "sft": {"learning_rate": 3e-3, "batch_size": 2, "micro_batch_size": 2, "packing": True},
        "train": {
            "epochs": 20,
            "max_steps": 2,
            "logging_interval": 1,
            "output_dir": "outputs",
            "seed": 0,
            "progress_bar": "off",
        },
        "eval": {"before_training": False, "after_training": False},
    }
    c = server.client()
    job = c.submit(config=cfg)
    done = c.wait(job["job_id"], timeout=180)
    assert done["status"] == "success" and done["kind"] == "sft", c.logs(job["job_id"], "stderr")
    records, _ = c.metrics(job["job_id"])
    assert [r["step"] for r in records] == [1, 2] and "loss" in records[0]
    assert json.loads((Path(done["run_dir"]) / "run.json").read_text())["kind"] == "sft"
