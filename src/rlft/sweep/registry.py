"""The sweep's registry is the job service's store: one row per attempt of a run.

    store = open_registry(sweep_dir, db=None)          # sqlite:///<sweep_dir>/registry.db
    job = add_attempt(store, sweep_dir, spec, run_dir, attempt=1)

Reusing :class:`rlft.service.store.JobStore` (and its Alembic migrations) means one schema, one
set of compare-and-set transitions and one reader for both: ``--db`` may even point a sweep at the
service's database, whose runner never claims a sweep's rows (``jobs.sweep`` tells them apart).
A run's attempts share its ``name`` and run directory; each retry names the attempt it retries
(``retry_of``), so the registry keeps the whole history.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlft.service.store import Job, JobStore, NewJob
from rlft.sweep.plan import RunSpec

REGISTRY_FILE = "registry.db"


def registry_url(sweep_dir: Path, db: str | None = None) -> str:
    return db or f"sqlite:///{(sweep_dir / REGISTRY_FILE).resolve()}"


def open_registry(sweep_dir: Path, db: str | None = None) -> JobStore:
    """The store of ``sweep_dir`` (created and migrated to the newest schema if needed)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return JobStore(registry_url(sweep_dir, db))


def sweep_id(sweep_dir: Path) -> str:
    """The value of ``jobs.sweep``: the sweep directory's absolute path, unique even in a shared database."""
    return str(sweep_dir.expanduser().resolve())


def add_attempt(
    store: JobStore,
    sweep_dir: Path,
    spec: RunSpec,
    run_dir: Path,
    attempt: int,
    retry_of: str | None = None,
    resume: str | None = None,
) -> Job:
    """Queue one attempt of ``spec`` (pending): its own job folder with the resolved config and log files."""
    job_id = store.new_id()
    job_dir = sweep_dir / "jobs" / job_id
    job_dir.mkdir(parents=True)
    (job_dir / "config.yaml").write_text(spec.config_yaml)
    for stream in ("stdout.log", "stderr.log"):
        (job_dir / stream).touch()
    return store.create(
        job_id,
        NewJob(
            kind=spec.kind,
            config_yaml=spec.config_yaml,
            config_source=spec.source,
            job_dir=str(job_dir.resolve()),
            run_dir=str(run_dir),
            resume_from=resume,
            resumed_job=retry_of if resume else None,
            sweep=sweep_id(sweep_dir),
            name=spec.name,
            attempt=attempt,
            retry_of=retry_of,
        ),
    )


def record_invalid(
    store: JobStore, sweep_dir: Path, spec: RunSpec, run_dir: Path, attempt: int = 1, retry_of: str | None = None
) -> Job:
    """A config that does not validate: a failed ``config_invalid`` row with the error, no process."""
    job = add_attempt(store, sweep_dir, spec, run_dir, attempt=attempt, retry_of=retry_of)
    store.finish(job.id, "failed", exit_code=None, error_type="config_invalid", summary=spec.error)
    store.record_outcome(job.id, failure_class="config_invalid")
    return store.get(job.id)


def attempts_by_name(store: JobStore, sweep: str) -> dict[str, list[Job]]:
    """Each run's attempts, oldest first; runs in the order they were first queued."""
    runs: dict[str, list[Job]] = {}
    for job in store.in_sweep(sweep):
        runs.setdefault(job.name or job.id, []).append(job)
    return runs


def metrics_of(job: Job) -> tuple[dict, dict]:
    """(final, best) metrics recorded on ``job`` ({} where none were)."""

    def parse(text: str | None) -> dict:
        try:
            value = json.loads(text) if text else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    return parse(job.metrics_final), parse(job.metrics_best)
