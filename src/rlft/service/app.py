"""The HTTP job service: FastAPI app over the job store, the runner and the workspace.

    app = create_app(Settings(workspace="ws"))   # rlft serve builds it and runs it under uvicorn

Every route but ``/api/health``, the dashboard's static files and the API schema needs a bearer
token once any token exists, and always off loopback (``rlft serve`` refuses such a bind without
one). Requests must carry a Host this service answers to; a POST must be JSON (a form another site
posts cannot be) and, if it says where it comes from (Origin), come from this service's own page.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlft import __version__
from rlft.service.backends import make_placement
from rlft.service.routes import Service, router
from rlft.service.runner import Runner
from rlft.service.schemas import Problem
from rlft.service.security import RateLimiter, Settings, host_of, limit_body, origin_allowed
from rlft.service.store import JobStore, default_url
from rlft.service.submit import Refused
from rlft.service.workspace import Workspace


def create_app(settings: Settings, start_runner: bool = True) -> FastAPI:
    ws = Workspace(settings.workspace)
    ws.service_dir.mkdir(exist_ok=True)
    placement = make_placement(settings.backend, settings.ray_address)  # first: a missing Ray is exit 2, nothing opened
    store = JobStore(settings.db_url or default_url(ws.root))
    runner = Runner(
        store,
        ws.root,
        slots=settings.slots,
        grace_seconds=settings.grace_seconds,
        poll_seconds=settings.poll_seconds,
        placement=placement,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if start_runner:
            runner.start()  # reconciles before the first request is served
        yield
        runner.stop()
        store.close()

    app = FastAPI(
        title="rlft job service",
        version=__version__,
        lifespan=lifespan,
        description="Submit, watch, cancel and resume rlft training jobs. The service runs configs, "
        "never commands; a token holder can run the code inside the workspace, nothing else.",
    )
    app.state.service = Service(settings, ws, store, runner, RateLimiter(settings.submissions_per_minute))
    _guard(app, settings)

    @app.exception_handler(Refused)
    def refused(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse(Problem(detail=exc.message, problems=exc.problems).model_dump(), status_code=exc.status)

    app.include_router(router)
    return app


# ---------------------------------------------------------------------- the front door


def _guard(app: FastAPI, settings: Settings) -> None:
    names = settings.host_names()

    @app.middleware("http")
    async def check_request(request: Request, call_next):
        host = host_of(request.headers.get("host", ""))
        if names is not None and host not in names:
            return JSONResponse({"detail": f"Host {host!r} is not a name this service answers to"}, status_code=421)
        if request.method == "POST":
            origin = request.headers.get("origin")
            if origin and not origin_allowed(settings, origin, request.headers.get("host", "")):
                return JSONResponse(
                    {"detail": f"cross-origin requests are refused (Origin {origin!r} is not this service's own page)"},
                    status_code=403,
                )
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            has_body = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
            if has_body and kind != "application/json":
                return JSONResponse(
                    {"detail": "the body must be JSON (Content-Type: application/json)"}, status_code=415
                )
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
