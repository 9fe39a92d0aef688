"""``rlft serve``: the HTTP job service and dashboard (also ``python serve.py``).

    rlft serve [--host 127.0.0.1] [--port 8000] [--workspace .] [--db URL] [--slots 1]
    rlft serve --backend ray [--ray-address auto]      # run the jobs on a Ray cluster (pip install 'rlft[ray]')
    rlft serve --workspace DIR --create-token alice     # prints a new token once; stores only its hash

It listens on loopback unless told otherwise, and refuses any other address until a token exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlft.errors import UsageError


def add_backend_arguments(p) -> None:
    """``--backend`` and ``--ray-address``: where job processes run (``rlft serve`` and ``rlft sweep``)."""
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="Where job processes run: this machine (default), or a Ray cluster, each job reserving the "
        "CPUs and GPUs its config declares (pip install 'rlft[ray]'; the workspace, models and data "
        "must be on a filesystem every node shares; docs/sweeps.md).",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="With --backend ray: the cluster for ray.init (auto, ray://host:10001, host:6379); default "
        "auto when RAY_ADDRESS is set, else a new local Ray instance.",
    )


def check_backend_arguments(args) -> None:
    if args.ray_address is not None and args.backend != "ray":
        raise UsageError("--ray-address is for --backend ray")


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default loopback only).")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--workspace",
        default=".",
        help="The only folder jobs may read, run code from and write to (default: the current directory).",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="SQLAlchemy URL of the job store (default: sqlite in <workspace>/.rlft/jobs.db; "
        "e.g. postgresql+psycopg://user@host/rlft).",
    )
    p.add_argument("--slots", type=int, default=1, help="Jobs run at once; the rest wait in a FIFO queue.")
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="After a cancel's SIGTERM, seconds before SIGKILL (default 30).",
    )
    add_backend_arguments(p)
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="Another Host name clients use (a DNS name, a proxy's); repeatable.",
    )
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--submissions-per-minute", type=int, default=30, help="Per token.")
    p.add_argument(
        "--create-token",
        default=None,
        metavar="NAME",
        help="Create (or replace) the API token NAME, print it once, and exit.",
    )


def settings_from(args):
    from rlft.service.security import Settings

    if args.slots < 1:
        raise UsageError("--slots must be at least 1")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: not a port number")
    check_backend_arguments(args)
    return Settings(
        workspace=str(Path(args.workspace).expanduser().resolve()),
        host=args.host,
        port=args.port,
        db_url=args.db,
        slots=args.slots,
        grace_seconds=args.grace,
        allowed_hosts=args.allowed_host,
        max_body_bytes=args.max_body_bytes,
        submissions_per_minute=args.submissions_per_minute,
        backend=args.backend,
        ray_address=args.ray_address,
    )


def require_service_packages(command: str, modules: tuple[str, ...]) -> None:
    """A usage error (exit 2) naming what ``rlft <command>`` lacks of the service extra, instead of an
    import's traceback from deep inside the command."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"rlft {command} needs {', '.join(missing)}: pip install 'rlft[service]'")


def run(args) -> int:
    require_service_packages("serve", ("fastapi", "uvicorn", "sqlalchemy", "alembic"))
    from rlft.service.security import is_loopback
    from rlft.service.store import JobStore, default_url
    from rlft.service.workspace import Workspace

    settings = settings_from(args)
    ws = Workspace(settings.workspace)
    ws.service_dir.mkdir(exist_ok=True)
    store = JobStore(settings.db_url or default_url(ws.root))
    try:
        if args.create_token:
            token = store.create_token(args.create_token)
            print(f"token for {args.create_token} (shown once; send it as 'Authorization: Bearer <token>'):\n{token}")
            return 0
        if not is_loopback(settings.host) and not store.has_tokens():
            raise UsageError(
                f"refusing to listen on {settings.host}: the job service runs training code, and on an address "
                f"other machines can reach it must require a token. Create one first with\n"
                f"  rlft serve --workspace {settings.workspace} --create-token NAME\n"
                f"or listen on 127.0.0.1 (the default)."
            )
    finally:
        store.close()
    import uvicorn

    from rlft.service.app import create_app

    print(
        f"rlft serve: workspace {settings.workspace}; jobs in {settings.db_url or default_url(ws.root)}; "
        f"dashboard at http://{_url_host(settings.host)}:{settings.port}/",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        server_header=False,
        proxy_headers=False,
    )
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
