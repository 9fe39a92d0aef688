"""The job store: jobs and API tokens in a real database through SQLAlchemy 2.

SQLite in the workspace by default (WAL mode: the HTTP handlers read while the runner writes);
any SQLAlchemy URL (``postgresql+psycopg://...``) for teams. The schema is created and upgraded by
Alembic (``rlft/service/migrations``), never by ``create_all``, so a store made by an older rlft is
migrated in place.

A job's status only moves forward: ``pending -> running -> success | failed | cancelled`` (or
``pending -> cancelled``); every transition is a compare-and-set ``UPDATE ... WHERE status = ...``,
so two workers can never both claim one job and a terminal state is never overwritten.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Boolean, Float, Integer, String, Text, create_engine, event, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

STATUSES = ("pending", "running", "success", "failed", "cancelled")
TERMINAL = ("success", "failed", "cancelled")


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, index=True)  # submission order: the FIFO queue
    kind: Mapped[str] = mapped_column(String(16), default="rl")
    status: Mapped[str] = mapped_column(String(16), index=True, default="pending")
    error_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid_started: Mapped[float | None] = mapped_column(Float, nullable=True)  # tells a reused pid apart
    worker: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    config_source: Mapped[str | None] = mapped_column(Text, nullable=True)
    config_yaml: Mapped[str] = mapped_column(Text)
    job_dir: Mapped[str] = mapped_column(Text)
    run_dir: Mapped[str] = mapped_column(Text)
    stdout_log: Mapped[str] = mapped_column(Text)
    stderr_log: Mapped[str] = mapped_column(Text)
    resume_from: Mapped[str | None] = mapped_column(Text, nullable=True)
    resumed_job: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the job this one continues
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)  # the last lines of stderr, or the reason
    submitted_by: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the token's name
    # rlft sweep's record of each attempt (migration 0002); NULL on the service's own jobs
    sweep: Mapped[str | None] = mapped_column(Text, nullable=True)
    name: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    metrics_final: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    metrics_best: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    retry_of: Mapped[str | None] = mapped_column(String(32), nullable=True)

    def as_dict(self) -> dict:
        return {c.name: getattr(self, c.name) for c in self.__table__.columns if c.name not in ("seq",)}


class Token(Base):
    __tablename__ = "tokens"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the token; the token is never kept
    created_at: Mapped[float] = mapped_column(Float)


def _digest(token: str) -> str:
    # Tokens are 256 random bits, so a plain hash is enough (no password stretching needed).
    return hashlib.sha256(token.encode()).hexdigest()


def default_url(workspace: Path) -> str:
    return f"sqlite:///{(workspace / '.rlft' / 'jobs.db').resolve()}"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def migrate(engine: Engine) -> None:
    """Bring the schema up to the newest Alembic revision (creates it in an empty database)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@dataclass
class NewJob:
    kind: str
    config_yaml: str
    config_source: str | None
    job_dir: str
    run_dir: str
    resume_from: str | None = None
    resumed_job: str | None = None
    submitted_by: str | None = None
    sweep: str | None = None
    name: str | None = None
    attempt: int | None = None
    retry_of: str | None = None


class JobStore:
    """Every read and state change of jobs and tokens. Methods return detached :class:`Job` rows."""

    def __init__(self, url: str, *, upgrade: bool = True):
        self.url = url
        self.engine = make_engine(url)
        if upgrade:
            migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def _session(self) -> Session:
        return self._sessions()

    # ------------------------------------------------------------------ jobs

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    def create(self, job_id: str, new: NewJob) -> Job:
        with self._session() as s, s.begin():
            last = s.scalar(select(Job.seq).order_by(Job.seq.desc()).limit(1)) or 0
            job = Job(
                id=job_id,
                seq=last + 1,
                status="pending",
                created_at=time.time(),
                kind=new.kind,
                config_yaml=new.config_yaml,
                config_source=new.config_source,
                job_dir=new.job_dir,
                run_dir=new.run_dir,
                stdout_log=str(Path(new.job_dir) / "stdout.log"),
                stderr_log=str(Path(new.job_dir) / "stderr.log"),
                resume_from=new.resume_from,
                resumed_job=new.resumed_job,
                submitted_by=new.submitted_by,
                cancel_requested=False,
                sweep=new.sweep,
                name=new.name,
                attempt=new.attempt,
                retry_of=new.retry_of,
            )
            s.add(job)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._session() as s:
            return s.get(Job, job_id)

    def list(self, status: str | None = None, limit: int = 500) -> list[Job]:
        with self._session() as s:
            q = select(Job).order_by(Job.seq.desc()).limit(limit)
            if status:
                q = q.where(Job.status == status)
            return list(s.scalars(q))

    def in_status(self, *statuses: str) -> list[Job]:
        with self._session() as s:
            return list(s.scalars(select(Job).where(Job.status.in_(statuses)).order_by(Job.seq)))

    def _cas(self, job_id: str, expected: tuple[str, ...], **values) -> bool:
        """Set ``values`` on the job only if its status is one of ``expected``; True if it was."""
        with self._session() as s, s.begin():
            result = s.execute(update(Job).where(Job.id == job_id, Job.status.in_(expected)).values(**values))
            return result.rowcount == 1

    def in_sweep(self, sweep: str) -> list[Job]:
        with self._session() as s:
            return list(s.scalars(select(Job).where(Job.sweep == sweep).order_by(Job.seq)))

    def claim_next(self, worker: str, sweep: str | None = None) -> Job | None:
        """Take the oldest pending job for ``worker`` (pending -> running), or None. Safe against any
        number of concurrent claimers: the update only succeeds while the job is still pending.
        Only the jobs of ``sweep`` (None: the service's own), so a sweep sharing the service's
        database never runs its jobs, nor the service a sweep's."""
        mine = Job.sweep.is_(None) if sweep is None else Job.sweep == sweep
        while True:
            with self._session() as s:
                job_id = s.scalar(select(Job.id).where(Job.status == "pending", mine).order_by(Job.seq).limit(1))
            if job_id is None:
                return None
            if self._cas(job_id, ("pending",), status="running", worker=worker, started_at=time.time()):
                return self.get(job_id)

    def set_process(self, job_id: str, pid: int, pid_started: float) -> None:
        self._cas(job_id, ("running",), pid=pid, pid_started=pid_started)

    def finish(
        self,
        job_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        error_type: str | None = None,
        summary: str | None = None,
    ) -> bool:
        """Move a job to a terminal ``status``; False (nothing changed) if it already was in one."""
        assert status in TERMINAL, status
        return self._cas(
            job_id,
            ("pending", "running"),
            status=status,
            exit_code=exit_code,
            error_type=error_type,
            summary=summary,
            finished_at=time.time(),
        )

    def record_outcome(self, job_id: str, **values) -> bool:
        """Add what ``rlft sweep`` learnt of an ended job (failure_class, metrics_final, metrics_best)."""
        return self._cas(job_id, TERMINAL, **values)

    def request_cancel(self, job_id: str) -> str | None:
        """Cancel a job: a pending one at once, a running one by flagging it for the runner. Returns the
        job's status afterwards (None if there is no such job)."""
        if self._cas(
            job_id,
            ("pending",),
            status="cancelled",
            finished_at=time.time(),
            cancel_requested=True,
            summary="cancelled before it started",
        ):
            return "cancelled"
        self._cas(job_id, ("running",), cancel_requested=True)
        job = self.get(job_id)
        return job.status if job else None

    # ------------------------------------------------------------------ tokens

    def create_token(self, name: str) -> str:
        """A new random token for ``name`` (replacing its old one); only its hash is stored."""
        token = "rlft_" + secrets.token_urlsafe(32)
        with self._session() as s, s.begin():
            existing = s.get(Token, name)
            if existing is not None:
                s.delete(existing)
                s.flush()
            s.add(Token(name=name, digest=_digest(token), created_at=time.time()))
        return token

    def has_tokens(self) -> bool:
        with self._session() as s:
            return s.scalar(select(Token.name).limit(1)) is not None

    def token_names(self) -> Iterator[str]:
        with self._session() as s:
            return iter(list(s.scalars(select(Token.name).order_by(Token.name))))

    def check_token(self, token: str) -> str | None:
        """The name of the token, or None. The hash of the presented token is compared with every
        stored hash in constant time, so neither the match nor its position leaks through timing."""
        presented = _digest(token)
        with self._session() as s:
            rows = list(s.execute(select(Token.name, Token.digest)))
        found = None
        for name, digest in rows:
            if hmac.compare_digest(presented, digest):
                found = name
        return found
