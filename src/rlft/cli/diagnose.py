"""``rlft diagnose``: is a run healthy? The same checks as the live ones, over what it logged.

    rlft diagnose outputs/my-run [--out DIR] [--json] [--no-plots]

Replays ``metrics.jsonl`` and ``eval/step-N.json`` through the health monitor (:mod:`rlft.health`),
prints the verdict and each finding (the step, what it means, the knob to turn), and writes
``report.md`` with a PNG per finding to ``<run>/health/`` (or ``--out``). Exit codes: 0 healthy or
warnings only, 3 unhealthy (so sweeps and CI can gate on it), 2 a usage error (no such run).
"""

from __future__ import annotations

import json
import sys


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="A run directory (outputs/<run_name>, holding metrics.jsonl).")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="Write report.md and the PNGs here (default: RUN_DIR/health; created if missing).",
    )
    p.add_argument("--json", action="store_true", help="Print the verdict and findings as JSON on stdout.")
    p.add_argument("--no-plots", action="store_true", help="Write report.md without the PNGs (faster).")


def run(args) -> int:
    from rlft.health import EXIT_UNHEALTHY
    from rlft.health.report import diagnose

    d = diagnose(args.run_dir, args.out, plots=not args.no_plots)
    if args.json:
        print(json.dumps(d.as_dict(), indent=2))
    else:
        print(
            f"{d.run_dir.name}: {d.verdict} ({len(d.findings)} finding(s) from {d.steps_logged} logged rows and "
            f"{d.evals} evaluation(s))"
        )
        for f in d.findings:
            print(f"  {f.line()}")
        for note in d.notes:
            print(f"  note: {note}")
        print(f"report: {d.report}", file=sys.stderr)
    return EXIT_UNHEALTHY if d.verdict == "unhealthy" else 0
