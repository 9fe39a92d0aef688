"""The HTTP job service: FastAPI app over the job store, the runner and the workspace.

    app = create_app(Settings(workspace="ws"))   # rlft serve builds it and runs it under uvicorn

Every route but ``/api/health``, the dashboard's static files and the API schema needs a bearer
token once any token exists, and always off loopback (``rlft serve`` refuses such a bind without
one). Requests must carry a Host this service answers to; a POST must be JSON (a form another site
posts cannot be) and, if it says where it comes from (Origin), come from this service's own page.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from rlft import __version__
from rlft.service import files
from rlft.service.runner import Runner, read_run_info
from rlft.service.schemas import (Evaluations, Health, JobDetail, JobInfo, JobList, Logs, Metrics, Problem,
                                  ResumeRequest, Samples, Status, Submitted, TrainRequest)
from rlft.service.security import RateLimiter, Settings, host_of, is_loopback, limit_body
from rlft.service.store import STATUSES, Job, JobStore, default_url
from rlft.service.submit import Refused, Submission, resume_job, submit
from rlft.service.workspace import Workspace

STATIC = Path(__file__).parent / "static"
PUBLIC = ("/api/health", "/", "/docs", "/openapi.json", "/favicon.ico")
_ERRORS = {code: {"model": Problem} for code in (400, 401, 403, 404, 409, 413, 415, 421, 422, 429)}


def create_app(settings: Settings, start_runner: bool = True) -> FastAPI:
    ws = Workspace(settings.workspace)
    ws.service_dir.mkdir(exist_ok=True)
    store = JobStore(settings.db_url or default_url(ws.root))
    runner = Runner(store, ws.root, slots=settings.slots, grace_seconds=settings.grace_seconds,
                    poll_seconds=settings.poll_seconds)
    limiter = RateLimiter(settings.submissions_per_minute)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if start_runner:
            runner.start()  # reconciles before the first request is served
        yield
        runner.stop()
        store.close()

    app = FastAPI(title="rlft job service", version=__version__, lifespan=lifespan,
                  description="Submit, watch, cancel and resume rlft training jobs. The service runs configs, "
                              "never commands; a token holder can run the code inside the workspace, nothing else.")
    app.state.store, app.state.runner, app.state.workspace, app.state.settings = store, runner, ws, settings
    _guard(app, settings)

    @app.exception_handler(Refused)
    def refused(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse(Problem(detail=exc.message, problems=exc.problems).model_dump(), status_code=exc.status)

    caller = _caller_dependency(store, settings)

    def job_or_404(job_id: str) -> Job:
        job = store.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return job

    def rate_limited(who: str | None) -> None:
        wait = limiter.allow(who or "(no token)")
        if wait is not None:
            raise HTTPException(429, f"more than {settings.submissions_per_minute} submissions a minute; "
                                     f"retry in {wait:.0f} s", headers={"Retry-After": str(int(wait) + 1)})

    @app.get("/api/health", response_model=Health, tags=["service"])
    def health() -> Health:
        counts = {s: 0 for s in STATUSES}
        for job in store.list():
            counts[job.status] += 1
        return Health(status="ok", version=__version__, jobs=counts,
                      auth_required=not is_loopback(settings.host) or store.has_tokens())

    @app.post("/api/train", response_model=Submitted, status_code=201, responses=_ERRORS, tags=["jobs"])
    def train(body: TrainRequest, who: str | None = Depends(caller)) -> Submitted:
        rate_limited(who)
        return _submitted(submit(store, ws, Submission(body.config_path, body.config, body.overrides,
                                                       body.resume_from), who))

    @app.get("/api/jobs", response_model=JobList, responses=_ERRORS, tags=["jobs"])
    def list_jobs(status: Status | None = None, limit: int = Query(200, ge=1, le=1000),
                  who: str | None = Depends(caller)) -> JobList:
        return JobList(jobs=[_info(j) for j in store.list(status, limit)])

    @app.get("/api/jobs/{job_id}", response_model=JobDetail, responses=_ERRORS, tags=["jobs"])
    def get_job(job_id: str, who: str | None = Depends(caller)) -> JobDetail:
        job = job_or_404(job_id)
        return JobDetail(**_info(job).model_dump(), config_yaml=job.config_yaml)

    @app.get("/api/jobs/{job_id}/logs", response_model=Logs, responses=_ERRORS, tags=["jobs"])
    def logs(job_id: str, stream: Literal["stdout", "stderr"] = "stdout", tail: int = Query(200, ge=1, le=10000),
             who: str | None = Depends(caller)) -> Logs:
        job = job_or_404(job_id)
        path = job.stdout_log if stream == "stdout" else job.stderr_log
        return Logs(stream=stream, text=_read(lambda: files.log_tail(path, job.job_dir, tail)))

    @app.get("/api/jobs/{job_id}/metrics", response_model=Metrics, responses=_ERRORS, tags=["jobs"])
    def metrics(job_id: str, offset: int = Query(0, ge=0), who: str | None = Depends(caller)) -> Metrics:
        job = job_or_404(job_id)
        records, end, reset = _read(lambda: files.read_jsonl_from(Path(job.run_dir) / "metrics.jsonl",
                                                                   (job.run_dir,), offset))
        return Metrics(records=records, offset=end, reset=reset)

    @app.get("/api/jobs/{job_id}/metrics/stream", responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS},
             tags=["jobs"])
    async def metrics_stream(job_id: str, request: Request, offset: int = Query(0, ge=0),
                             who: str | None = Depends(caller)):
        """Server-sent events: one ``metrics`` event per record, its ``id`` the byte offset after it,
        so a reconnect (``Last-Event-ID``) resumes where it stopped; ``end`` once the job has ended."""
        job = job_or_404(job_id)
        last = request.headers.get("last-event-id", "")
        start = int(last) if last.isdigit() else offset
        return StreamingResponse(_sse(store, job, start, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.get("/api/jobs/{job_id}/samples", response_model=Samples, responses=_ERRORS, tags=["jobs"])
    def get_samples(job_id: str, steps: int = Query(3, ge=1, le=1000), who: str | None = Depends(caller)) -> Samples:
        job = job_or_404(job_id)
        return Samples(groups=_read(lambda: files.samples(job.run_dir, steps)))

    @app.get("/api/jobs/{job_id}/eval", response_model=Evaluations, responses=_ERRORS, tags=["jobs"])
    def get_eval(job_id: str, who: str | None = Depends(caller)) -> Evaluations:
        return Evaluations(results=files.evaluations(job_or_404(job_id).run_dir))

    @app.post("/api/jobs/{job_id}/cancel", response_model=JobInfo, responses=_ERRORS, tags=["jobs"])
    def cancel(job_id: str, who: str | None = Depends(caller)) -> JobInfo:
        job_or_404(job_id)
        store.request_cancel(job_id)
        return _info(store.get(job_id))

    @app.post("/api/jobs/{job_id}/resume", response_model=Submitted, status_code=201, responses=_ERRORS,
              tags=["jobs"])
    def resume(job_id: str, body: ResumeRequest | None = None, who: str | None = Depends(caller)) -> Submitted:
        rate_limited(who)
        old = job_or_404(job_id)
        return _submitted(resume_job(store, ws, old, body.overrides if body else None, who))

    @app.get("/", include_in_schema=False)
    def dashboard():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        return _static_file(name)

    return app


# ---------------------------------------------------------------------- helpers


def _guard(app: FastAPI, settings: Settings) -> None:
    names = settings.host_names()

    @app.middleware("http")
    async def check_request(request: Request, call_next):
        host = host_of(request.headers.get("host", ""))
        if names is not None and host not in names:
            return JSONResponse({"detail": f"Host {host!r} is not a name this service answers to"}, status_code=421)
        if request.method == "POST":
            origin = request.headers.get("origin")
            if origin and host_of(origin.partition("://")[2].rstrip("/")) != host:
                return JSONResponse({"detail": "cross-origin requests are refused"}, status_code=403)
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            has_body = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
            if has_body and kind != "application/json":
                return JSONResponse({"detail": "the body must be JSON (Content-Type: application/json)"},
                                    status_code=415)
        response = await call_next(request)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes)


class _BodyLimit:
    def __init__(self, app, max_bytes: int):
        self._app = limit_body(app, max_bytes)

    async def __call__(self, scope, receive, send):
        await self._app(scope, receive, send)


def _caller_dependency(store: JobStore, settings: Settings):
    """A dependency giving the calling token's name (None on an open loopback service)."""
    open_allowed = is_loopback(settings.host)

    def caller(request: Request) -> str | None:
        if open_allowed and not store.has_tokens():
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        name = store.check_token(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if name is None:
            raise HTTPException(401, "a valid bearer token is required (rlft serve --create-token NAME makes one)",
                                headers={"WWW-Authenticate": "Bearer"})
        return name

    return caller


def _read(read):
    try:
        return read()
    except files.OutsideJob as exc:
        raise HTTPException(403, str(exc)) from None


def _submitted(job: Job) -> Submitted:
    return Submitted(job_id=job.id, status=job.status, run_dir=job.run_dir, stdout_log=job.stdout_log,
                     stderr_log=job.stderr_log)


def _info(job: Job) -> JobInfo:
    fields = {k: v for k, v in job.as_dict().items() if k in JobInfo.model_fields}
    run = read_run_info(job.run_dir)
    return JobInfo(**fields, step=run.get("step"), total_steps=run.get("total_steps"))


def _static_file(name: str):
    from rlft.service.dashboard import static_path

    path = static_path(name)
    if path is None:
        raise HTTPException(404, "no such file")
    return FileResponse(path)


async def _sse(store: JobStore, job: Job, offset: int, request: Request):
    path, roots = Path(job.run_dir) / "metrics.jsonl", (job.run_dir,)
    while True:
        records, end, reset = files.read_jsonl_from(path, roots, offset)
        if reset:  # the file was rewritten (a resume): the client starts over
            yield f"id: 0\nevent: reset\ndata: {{}}\n\n"
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
