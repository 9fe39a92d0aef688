"""``rlft jobs``: the job service from the command line (see :mod:`rlft.client`).

    rlft jobs submit --config configs/minimal_example.yaml [--resume auto] [--set train.max_steps=5] [--wait]
    rlft jobs list [--status running]
    rlft jobs status ID
    rlft jobs logs ID [--stream stderr] [--tail 100]
    rlft jobs cancel ID
    rlft jobs resume ID [--set train.max_steps=20]

--url (default $RLFT_URL or http://127.0.0.1:8000) and --token (default $RLFT_TOKEN) name the service.
"""

from __future__ import annotations

import json
import time

from rlft.cli.options import add_overrides
from rlft.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--url", default=None, help="The service (default $RLFT_URL or http://127.0.0.1:8000).")
    p.add_argument("--token", default=None, help="API token (default $RLFT_TOKEN).")
    sub = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    s = sub.add_parser("submit", help="Queue a training job from a config in the service's workspace.")
    s.add_argument("--config", "-c", required=True, help="Path of the YAML config, relative to the workspace.")
    s.add_argument("--resume", default=None, metavar="CHECKPOINT|auto")
    add_overrides(s)
    s.add_argument("--wait", action="store_true", help="Wait for the job to end; exit 0 only on success.")
    ls = sub.add_parser("list", help="Jobs, newest first.")
    ls.add_argument("--status", default=None, choices=["pending", "running", "success", "failed", "cancelled"])
    st = sub.add_parser("status", help="One job, with its config.")
    st.add_argument("job_id")
    lg = sub.add_parser("logs", help="The tail of a job's stdout or stderr.")
    lg.add_argument("job_id")
    lg.add_argument("--stream", choices=["stdout", "stderr"], default="stdout")
    lg.add_argument("--tail", type=int, default=100)
    c = sub.add_parser("cancel", help="Cancel a job (a running one stops after its step, with a checkpoint).")
    c.add_argument("job_id")
    r = sub.add_parser("resume", help="Continue a failed or cancelled job from its latest checkpoint.")
    r.add_argument("job_id")
    add_overrides(r)


def run(args) -> int:
    from rlft.client import Client, ServiceError

    with Client(args.url, args.token) as client:
        try:
            return ACTIONS[args.jobs_command](client, args)
        except ServiceError as exc:
            raise UsageError(str(exc)) from None


def _submit(client, args) -> int:
    job = client.submit(args.config, resume_from=args.resume, overrides=args.overrides)
    print(json.dumps(job, indent=2))
    if not args.wait:
        return 0
    done = client.wait(job["job_id"])
    print(f"job {done['id']}: {done['status']}" + (f" ({done['error_type']})" if done.get("error_type") else ""))
    return 0 if done["status"] == "success" else 1


def _list(client, args) -> int:
    jobs = client.jobs(args.status)
    print(f"{'id':<13} {'status':<10} {'kind':<4} {'step':>9}  {'age':>6}  config")
    for j in jobs:
        step = f"{j['step'] or 0}/{j['total_steps'] or '?'}" if j["status"] != "pending" else "-"
        age = _age(j["created_at"])
        reason = f" ({j['error_type']})" if j.get("error_type") else ""
        print(f"{j['id']:<13} {j['status']:<10} {j['kind']:<4} {step:>9}  {age:>6}  {j['config_source']}{reason}")
    return 0


def _age(t: float) -> str:
    s = max(0, time.time() - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def _status(client, args) -> int:
    print(json.dumps(client.job(args.job_id), indent=2))
    return 0


def _logs(client, args) -> int:
    print(client.logs(args.job_id, args.stream, args.tail))
    return 0


def _cancel(client, args) -> int:
    job = client.cancel(args.job_id)
    print(
        f"job {job['id']}: {job['status']}"
        + (" (stopping after its current step)" if job["status"] == "running" else "")
    )
    return 0


def _resume(client, args) -> int:
    print(json.dumps(client.resume(args.job_id, args.overrides), indent=2))
    return 0


ACTIONS = {"submit": _submit, "list": _list, "status": _status, "logs": _logs, "cancel": _cancel, "resume": _resume}
