"""What the service's resume continues from: the newest intact checkpoint, afresh in place for a run
stopped before its first save, and a refusal when every checkpoint is damaged (never a silent restart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlft.checkpoint.manifest import write_manifest
from rlft.config.loader import config_to_yaml, load_config
from rlft.service.store import JobStore, NewJob
from rlft.service.submit import Refused, Submission, resume_job, submit
from rlft.service.workspace import Workspace
from tests.conftest import write_jsonl


@pytest.fixture
def ws(tmp_path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    write_jsonl(ws.root / "data" / "train.jsonl", [{"prompt": "p", "answer": "a"}])
    return ws


def _config(**train):
    return load_config(
        data={
            "model": {"path": "smollm2-135m-instruct"},
            "data": {"train_file": "data/train.jsonl"},
            "reward": {"functions": [{"type": "contains", "keyword": "a"}]},
            "train": {"output_dir": "outputs", **train},
        },
        base_dir=None,
        check_files=False,
    )


def _checkpoint(run: Path, step: int) -> Path:
    ck = run / "checkpoints" / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pt", "config.yaml"):
        (ck / name).write_bytes(b"x" * 64)
    write_manifest(ck, save_optimizer=True)
    (ck / "trainer_state.json").write_text(json.dumps({"step": step}))
    return ck


def _cancelled_job(store: JobStore, ws: Workspace, run: Path) -> object:
    run.mkdir(parents=True, exist_ok=True)
    (run / "run.json").write_text(json.dumps({"status": "cancelled"}))
    job_id = store.new_id()
    (ws.jobs_dir() / job_id).mkdir(parents=True)
    store.create(
        job_id,
        NewJob(
            kind="rl",
            config_yaml=config_to_yaml(_config()),
            config_source="<inline>",
            job_dir=str(ws.jobs_dir() / job_id),
            run_dir=str(run),
        ),
    )
    store.claim_next("test")
    store.finish(job_id, "cancelled", exit_code=143)
    return store.get(job_id)


@pytest.fixture
def store(tmp_path) -> JobStore:
    s = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield s
    s.close()


def test_a_damaged_newest_checkpoint_is_passed_over(store, ws):
    run = ws.root / "outputs" / "run"
    old = _cancelled_job(store, ws, run)
    _checkpoint(run, 2)
    newest = _checkpoint(run, 4)
    (newest / "model.safetensors").write_bytes(b"x" * 10)  # truncated
    job = resume_job(store, ws, old, [])
    assert job.resume_from.endswith("checkpoint-2")


def test_a_run_stopped_before_its_first_save_restarts_in_place(store, ws):
    run = ws.root / "outputs" / "run"
    old = _cancelled_job(store, ws, run)
    job = resume_job(store, ws, old, [])
    assert job.resume_from == "auto" and job.run_dir == str(run)


def test_every_checkpoint_damaged_is_refused_naming_each(store, ws):
    run = ws.root / "outputs" / "run"
    old = _cancelled_job(store, ws, run)
    for step in (2, 4):
        (_checkpoint(run, step) / "optimizer.pt").unlink()
    with pytest.raises(Refused) as err:
        resume_job(store, ws, old, [])
    assert err.value.status == 409 and "every checkpoint" in err.value.message
    assert [p.split(":")[0] for p in err.value.problems] == ["checkpoint-2", "checkpoint-4"]
    assert all("optimizer.pt is missing" in p for p in err.value.problems)


def test_resume_auto_with_a_run_name_continues_that_run_in_place(store, ws):
    run = ws.root / "outputs" / "named"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "cancelled"}))
    job = submit(
        store,
        ws,
        Submission(
            config={**json.loads(json.dumps(_config(run_name="named").model_dump(mode="json", by_alias=True)))},
            resume_from="auto",
        ),
    )
    assert job.run_dir == str(run) and job.resume_from == "auto"
    ck = _checkpoint(run, 3)
    (ck / "scheduler.pt").write_bytes(b"")
    with pytest.raises(Refused) as err:
        submit(
            store,
            ws,
            Submission(config=_config(run_name="named").model_dump(mode="json", by_alias=True), resume_from=str(ck)),
        )
    assert err.value.status == 422 and "scheduler.pt" in " ".join(err.value.problems)
