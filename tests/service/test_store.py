"""The job store, on SQLite and on a real PostgreSQL server (``RLFT_TEST_POSTGRES_URL``, which
.ci/run sets after starting one from the distribution's packages)."""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import create_engine, inspect, text

from rlft.service.store import JobStore, NewJob

POSTGRES = os.environ.get("RLFT_TEST_POSTGRES_URL")


def _reset_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for table in ("jobs", "tokens", "alembic_version"):
            conn.execute(text(f"DROP TABLE IF EXISTS {table} CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    if not POSTGRES:
        if os.environ.get("RLFT_REQUIRE_POSTGRES") == "1":
            pytest.fail("RLFT_REQUIRE_POSTGRES=1 but RLFT_TEST_POSTGRES_URL is not set")
        pytest.skip("no PostgreSQL server (set RLFT_TEST_POSTGRES_URL; scripts/ci_services.sh starts one)")
    _reset_postgres(POSTGRES)
    yield POSTGRES
    _reset_postgres(POSTGRES)


def _new(store: JobStore, tmp_path, n: int = 1) -> list[str]:
    ids = []
    for i in range(n):
        job_id = store.new_id()
        store.create(job_id, NewJob("rl", "a: 1", f"c{i}.yaml", str(tmp_path / job_id), str(tmp_path / "run" / job_id)))
        ids.append(job_id)
    return ids


def test_schema_comes_from_alembic_and_migrating_again_is_a_no_op(url, tmp_path):
    store = JobStore(url)
    tables = set(inspect(store.engine).get_table_names())
    assert {"jobs", "tokens", "alembic_version"} <= tables
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0002"
    job = _new(store, tmp_path)[0]
    store.close()
    again = JobStore(url)  # a restart upgrades in place and keeps the jobs
    assert again.get(job).status == "pending"
    again.close()


def test_sqlite_store_runs_in_wal_mode(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    store.close()


def test_claims_are_fifo_and_no_job_is_claimed_twice_under_contention(url, tmp_path):
    store = JobStore(url)
    ids = _new(store, tmp_path, 40)
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        own = JobStore(url, upgrade=False)  # its own engine, as another service process would have
        while (job := own.claim_next(name)) is not None:
            with lock:
                claimed.append((job.id, name))
        own.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [job_id for job_id, _ in claimed]
    assert sorted(got) == sorted(ids) and len(set(got)) == len(ids)
    assert all(store.get(i).status == "running" for i in ids)
    store.close()

    fifo = JobStore(url)
    later = _new(fifo, tmp_path, 3)
    assert [fifo.claim_next("w").id for _ in later] == later
    fifo.close()


def test_terminal_states_never_change_and_cancel_of_pending_is_immediate(url, tmp_path):
    store = JobStore(url)
    a, b = _new(store, tmp_path, 2)
    assert store.claim_next("w").id == a
    assert store.finish(a, "success", exit_code=0)
    assert not store.finish(a, "failed", error_type="unknown")  # terminal: refused
    assert store.request_cancel(a) == "success" and store.get(a).status == "success"
    assert store.request_cancel(b) == "cancelled"
    assert store.claim_next("w") is None  # a cancelled job is never claimed
    assert store.request_cancel("missing") is None
    store.close()


def test_tokens_are_stored_hashed_and_checked(url, tmp_path):
    store = JobStore(url)
    assert not store.has_tokens()
    token = store.create_token("alice")
    assert store.check_token(token) == "alice" and store.check_token(token + "x") is None
    assert store.check_token("") is None
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT digest FROM tokens")).scalars().all()
    assert token not in stored and len(stored[0]) == 64
    replaced = store.create_token("alice")
    assert store.check_token(token) is None and store.check_token(replaced) == "alice"
    assert list(store.token_names()) == ["alice"]
    store.close()
