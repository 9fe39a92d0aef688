"""The registry is the job store: migration 0002 upgrades an older store in place, and a sweep's rows
and the service's own jobs never mix in one database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

import rlft.service.store as store_module
from rlft.service.store import JobStore, NewJob, make_engine, migrate
from rlft.sweep.plan import RunSpec
from rlft.sweep.registry import add_attempt, attempts_by_name, metrics_of, open_registry, sweep_id

SWEEP_COLUMNS = {"sweep", "name", "attempt", "failure_class", "metrics_final", "metrics_best", "retry_of"}


def _alembic(url: str, action: str, revision: str) -> None:
    """``alembic upgrade|downgrade REVISION`` on the store's migrations."""
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(store_module.__file__).parent / "migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)
    engine.dispose()


def test_a_0001_store_is_upgraded_in_place_and_its_jobs_keep_working(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    _alembic(url, "upgrade", "0001")
    engine = make_engine(url)
    with engine.begin() as conn:
        assert not SWEEP_COLUMNS & {c["name"] for c in inspect(conn).get_columns("jobs")}
        conn.execute(
            text(
                "INSERT INTO jobs (id, seq, kind, status, created_at, config_yaml, job_dir, run_dir, "
                "stdout_log, stderr_log, cancel_requested) VALUES ('old', 1, 'rl', 'pending', 0, 'x: 1', "
                "'j', 'r', 'o', 'e', 0)"
            )
        )
    engine.dispose()
    store = JobStore(url)  # migrates to 0002
    assert SWEEP_COLUMNS <= {c["name"] for c in inspect(store.engine).get_columns("jobs")}
    old = store.get("old")
    assert old.status == "pending" and old.sweep is None and old.attempt is None
    assert store.claim_next("w").id == "old"  # the service still runs its job
    assert store.finish("old", "success", exit_code=0)
    store.close()


def test_downgrade_drops_the_sweep_columns(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    migrate(make_engine(url))
    _alembic(url, "downgrade", "0001")
    engine = make_engine(url)
    assert not SWEEP_COLUMNS & {c["name"] for c in inspect(engine).get_columns("jobs")}
    engine.dispose()


def test_the_service_and_a_sweep_share_a_database_without_taking_each_others_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    store = open_registry(sweep_dir, f"sqlite:///{tmp_path / 'shared.db'}")
    spec = RunSpec(name="a", source="a.yaml", config_yaml="train: {}\n")
    mine = add_attempt(store, sweep_dir, spec, tmp_path / "runs" / "a", attempt=1)
    service = store.create(
        store.new_id(),
        NewJob(
            kind="rl", config_yaml="x: 1", config_source=None, job_dir=str(tmp_path / "j"), run_dir=str(tmp_path / "r")
        ),
    )
    assert (sweep_dir / "jobs" / mine.id / "config.yaml").read_text() == "train: {}\n"
    assert mine.sweep == sweep_id(sweep_dir) and mine.name == "a" and mine.attempt == 1
    assert store.claim_next("service").id == service.id and store.claim_next("service") is None
    assert store.claim_next("sweep", sweep_id(sweep_dir)).id == mine.id
    assert store.finish(mine.id, "failed", exit_code=1, error_type="transient")
    assert store.record_outcome(mine.id, failure_class="transient", metrics_final='{"loss": 0.5}', metrics_best="{}")
    retry = add_attempt(store, sweep_dir, spec, tmp_path / "runs" / "a", attempt=2, retry_of=mine.id, resume="auto")
    assert retry.retry_of == mine.id and retry.resumed_job == mine.id and retry.resume_from == "auto"
    runs = attempts_by_name(store, sweep_id(sweep_dir))
    assert list(runs) == ["a"] and [j.attempt for j in runs["a"]] == [1, 2]
    assert metrics_of(runs["a"][0]) == ({"loss": 0.5}, {})
    assert not store.record_outcome(retry.id, failure_class="x")  # only an ended attempt has an outcome
    store.close()
