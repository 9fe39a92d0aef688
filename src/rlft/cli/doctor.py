"""``rlft doctor [--config X] [--json] [--port N]``: what this machine (and run) is ready for."""

from __future__ import annotations

import argparse
import json

from rlft.cli.options import add_overrides


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=None, help="Also check this run: config, model, memory, disk.")
    add_overrides(p)
    p.add_argument("--port", type=int, default=8000, help="The port rlft serve would listen on (default 8000).")
    p.add_argument("--json", action="store_true", help="Print the checks as JSON.")


def run(args) -> int:
    from rlft.doctor import doctor

    report = doctor(args.config, args.overrides, port=args.port)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1
