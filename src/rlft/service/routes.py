"""The job API's routes. Each reads the :class:`Service` the app was made with through a
dependency, so the routes hold no state of their own; ``caller`` checks the bearer token first,
so a request without one learns nothing (401 before any 404)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, StreamingResponse

from rlft import __version__
from rlft.service import files
from rlft.service.dashboard import static_path
from rlft.service.runner import Runner, read_run_info
from rlft.service.schemas import (
    Evaluations,
    Health,
    JobDetail,
    JobInfo,
    JobList,
    Logs,
    Metrics,
    Problem,
    ResumeRequest,
    Samples,
    Status,
    Submitted,
    TrainRequest,
)
from rlft.service.security import RateLimiter, Settings, is_loopback
from rlft.service.stall import stalled
from rlft.service.store import STATUSES, Job, JobStore
from rlft.service.submit import Submission, resume_job, submit
from rlft.service.workspace import Workspace

_ERRORS = {code: {"model": Problem} for code in (400, 401, 403, 404, 409, 413, 415, 421, 422, 429)}

router = APIRouter()


@dataclass
class Service:
    """What the routes work with: one per app."""

    settings: Settings
    workspace: Workspace
    store: JobStore
    runner: Runner
    limiter: RateLimiter

    def rate_limit(self, who: str | None) -> None:
        wait = self.limiter.allow(who or "(no token)")
        if wait is not None:
            raise HTTPException(
                429,
                f"more than {self.settings.submissions_per_minute} submissions a minute; retry in {wait:.0f} s",
                headers={"Retry-After": str(int(wait) + 1)},
            )


def service(request: Request) -> Service:
    return request.app.state.service


def caller(request: Request, svc: Service = Depends(service)) -> str | None:
    """The calling token's name; None on a loopback service that has no token yet."""
    if is_loopback(svc.settings.host) and not svc.store.has_tokens():
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    name = svc.store.check_token(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
    if name is None:
        raise HTTPException(
            401,
            "a valid bearer token is required (rlft serve --create-token NAME makes one)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return name


def job_of_path(job_id: str, svc: Service = Depends(service), who: str | None = Depends(caller)) -> Job:
    job = svc.store.get(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return job


@router.get("/api/health", response_model=Health, tags=["service"])
def health(svc: Service = Depends(service)) -> Health:
    counts = {s: 0 for s in STATUSES}
    for job in svc.store.list():
        counts[job.status] += 1
    return Health(
        status="ok",
        version=__version__,
        jobs=counts,
        auth_required=not is_loopback(svc.settings.host) or svc.store.has_tokens(),
    )


@router.post("/api/train", response_model=Submitted, status_code=201, responses=_ERRORS, tags=["jobs"])
def train(body: TrainRequest, svc: Service = Depends(service), who: str | None = Depends(caller)) -> Submitted:
    svc.rate_limit(who)
    return _submitted(
        submit(
            svc.store, svc.workspace, Submission(body.config_path, body.config, body.overrides, body.resume_from), who
        )
    )


@router.get("/api/jobs", response_model=JobList, responses=_ERRORS, tags=["jobs"])
def list_jobs(
    status: Status | None = None,
    limit: int = Query(200, ge=1, le=1000),
    svc: Service = Depends(service),
    who: str | None = Depends(caller),
) -> JobList:
    return JobList(jobs=[_info(j) for j in svc.store.list(status, limit)])


@router.get("/api/jobs/{job_id}", response_model=JobDetail, responses=_ERRORS, tags=["jobs"])
def get_job(job: Job = Depends(job_of_path)) -> JobDetail:
    return JobDetail(**_info(job).model_dump(), config_yaml=job.config_yaml)


@router.get("/api/jobs/{job_id}/logs", response_model=Logs, responses=_ERRORS, tags=["jobs"])
def logs(
    stream: Literal["stdout", "stderr"] = "stdout",
    tail: int = Query(200, ge=1, le=10000),
    job: Job = Depends(job_of_path),
    svc: Service = Depends(service),
) -> Logs:
    path = job.stdout_log if stream == "stdout" else job.stderr_log
    return Logs(stream=stream, text=_read(lambda: files.log_tail(path, job.job_dir, tail, _ws(svc))))


@router.get("/api/jobs/{job_id}/metrics", response_model=Metrics, responses=_ERRORS, tags=["jobs"])
def metrics(offset: int = Query(0, ge=0), job: Job = Depends(job_of_path), svc: Service = Depends(service)) -> Metrics:
    records, end, reset = _read(
        lambda: files.read_jsonl_from(Path(job.run_dir) / "metrics.jsonl", (job.run_dir,), offset, workspace=_ws(svc))
    )
    return Metrics(records=records, offset=end, reset=reset)


@router.get(
    "/api/jobs/{job_id}/metrics/stream",
    responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS},
    tags=["jobs"],
)
async def metrics_stream(
    request: Request, offset: int = Query(0, ge=0), job: Job = Depends(job_of_path), svc: Service = Depends(service)
):
    """Server-sent events: one ``metrics`` event per record, its ``id`` the byte offset after it,
    so a reconnect (``Last-Event-ID``) resumes where it stopped; ``end`` once the job has ended."""
    last = request.headers.get("last-event-id", "")
    start = int(last) if last.isdigit() else offset
    _read(lambda: files.checked(Path(job.run_dir) / "metrics.jsonl", (job.run_dir,), _ws(svc)))  # 403 up front
    return StreamingResponse(
        _sse(svc, job, start, request), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


@router.get("/api/jobs/{job_id}/samples", response_model=Samples, responses=_ERRORS, tags=["jobs"])
def get_samples(
    steps: int = Query(3, ge=1, le=1000), job: Job = Depends(job_of_path), svc: Service = Depends(service)
) -> Samples:
    return Samples(groups=_read(lambda: files.samples(job.run_dir, steps, workspace=_ws(svc))))


@router.get("/api/jobs/{job_id}/eval", response_model=Evaluations, responses=_ERRORS, tags=["jobs"])
def get_eval(job: Job = Depends(job_of_path), svc: Service = Depends(service)) -> Evaluations:
    return Evaluations(results=_read(lambda: files.evaluations(job.run_dir, _ws(svc))))


@router.post("/api/jobs/{job_id}/cancel", response_model=JobInfo, responses=_ERRORS, tags=["jobs"])
def cancel(job: Job = Depends(job_of_path), svc: Service = Depends(service)) -> JobInfo:
    svc.store.request_cancel(job.id)
    return _info(svc.store.get(job.id))


@router.post("/api/jobs/{job_id}/resume", response_model=Submitted, status_code=201, responses=_ERRORS, tags=["jobs"])
def resume(
    body: ResumeRequest | None = None,
    old: Job = Depends(job_of_path),
    svc: Service = Depends(service),
    who: str | None = Depends(caller),
) -> Submitted:
    svc.rate_limit(who)
    return _submitted(resume_job(svc.store, svc.workspace, old, body.overrides if body else None, who))


@router.get("/", include_in_schema=False)
def dashboard():
    return _static_file("index.html")


@router.get("/static/{name}", include_in_schema=False)
def static(name: str):
    return _static_file(name)


def _ws(svc: Service) -> str:
    return str(svc.workspace.root)


def _read(read):
    try:
        return read()
    except files.OutsideJob as exc:
        raise HTTPException(403, str(exc)) from None


def _submitted(job: Job) -> Submitted:
    return Submitted(
        job_id=job.id, status=job.status, run_dir=job.run_dir, stdout_log=job.stdout_log, stderr_log=job.stderr_log
    )


def _info(job: Job) -> JobInfo:
    fields = {k: v for k, v in job.as_dict().items() if k in JobInfo.model_fields}
    run = read_run_info(job.run_dir)
    progress = run.get("progress")
    verdict, findings = _health(run)
    return JobInfo(
        **fields,
        step=run.get("step"),
        total_steps=run.get("total_steps"),
        last_progress=progress if isinstance(progress, (int, float)) else None,
        stalled=stalled(run) if job.status == "running" else None,
        health=verdict,
        health_findings=findings,
    )


def _health(run: dict) -> tuple[str | None, list[dict]]:
    """run.json's health verdict and findings (written by the trainer at each logging step and at the
    end); nothing for a run that recorded none, or recorded something this version does not know."""
    health = run.get("health")
    if not isinstance(health, dict) or health.get("verdict") not in ("healthy", "warnings", "unhealthy"):
        return None, []
    return health["verdict"], [f for f in health.get("findings", []) if isinstance(f, dict)]


def _static_file(name: str):
    path = static_path(name)
    if path is None:
        raise HTTPException(404, "no such file")
    return FileResponse(path)


async def _sse(svc: Service, job: Job, offset: int, request: Request):
    """The events of :func:`metrics_stream`. A file refused mid-stream (a link planted after the stream
    began) ends it with an ``error`` event saying why, never a server traceback."""
    path, roots, store = Path(job.run_dir) / "metrics.jsonl", (job.run_dir,), svc.store
    while True:
        try:
            records, end, reset = files.read_jsonl_from(path, roots, offset, workspace=_ws(svc))
        except files.OutsideJob as exc:
            yield f"event: error\ndata: {json.dumps({'status': 403, 'detail': str(exc)})}\n\n"
            return
        if reset:  # the file was rewritten (a resume): the client starts over
            yield "id: 0\nevent: reset\ndata: {}\n\n"
        if records:
            # one event per read carries every record; its id is the offset after the last one
            yield f"id: {end}\nevent: metrics\ndata: {json.dumps(records)}\n\n"
            offset = end
        current = store.get(job.id)
        if current.status in ("success", "failed", "cancelled") and not records:
            yield f"id: {offset}\nevent: end\ndata: {json.dumps({'status': current.status})}\n\n"
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(1.0)
