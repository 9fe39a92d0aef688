"""``rlft sweep``: many runs in one command, each failure classified, the lot summarised at the end.

    rlft sweep configs/experiments/                       # every *.yaml of the folder, sorted
    rlft sweep --config base.yaml --grid algorithm.kl_coef=0.01,0.05 --grid algorithm.learning_rate=1e-6,2e-6
    rlft sweep configs/experiments/ --parallel 2 --set train.max_steps=50 --out sweeps/kl
    rlft sweep --resume --out sweeps/kl                   # skip the successes, continue the interrupted
    rlft sweep --summary sweeps/kl                        # print (and rewrite) the summary again
    rlft sweep configs/experiments/ --backend ray --ray-address auto   # each run on a Ray cluster's node

Exit code 0 when every run succeeded, 1 when one did not, 2 for a usage error. See docs/sweeps.md
and :mod:`rlft.sweep`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rlft.cli.options import add_overrides
from rlft.cli.serve import add_backend_arguments, check_backend_arguments, require_service_packages


def add_arguments(p) -> None:
    p.add_argument(
        "sources",
        nargs="*",
        metavar="FOLDER|CONFIG",
        help="Folders of run configs (every *.yaml, sorted) or config files; or use --config with --grid.",
    )
    p.add_argument("--config", "-c", default=None, metavar="BASE", help="The base config of a --grid sweep.")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="Values of one key (parsed like --set); the runs are the cartesian product of all --grid.",
    )
    add_overrides(p, "Override a value in every run's config (repeatable).")
    p.add_argument("--out", default=None, metavar="DIR", help="The sweep directory (default ./sweeps/<date>-<time>).")
    p.add_argument("--db", default=None, metavar="URL", help="Registry database (default sqlite:///<out>/registry.db).")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="Runs at a time (default 1).")
    p.add_argument("--retries", type=int, default=2, metavar="K", help="Retries of a retryable failure (default 2).")
    p.add_argument(
        "--retry-on",
        default="transient",
        metavar="CLASSES",
        help="Failure classes retried, comma-separated (default transient; never config_invalid, data, reward).",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="Wait before the first retry, doubled for each next one (default 10).",
    )
    p.add_argument(
        "--fail-fast",
        action="store_true",
        help="After the first failure that is not retried, start nothing new and cancel the running runs.",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="Continue the sweep in --out: skip its successes, continue interrupted, cancelled and "
        "transient-failed runs from their checkpoints.",
    )
    add_backend_arguments(p)
    p.add_argument("--summary", default=None, metavar="DIR", help="Only print (and rewrite) the summary of DIR.")
    p.add_argument("--no-plots", action="store_true", help="Do not draw the overlaid curves in <out>/plots.")
    p.add_argument("--json", action="store_true", help="Print the summary as JSON on stdout (progress on stderr).")


def run(args) -> int:
    from rlft.errors import UsageError

    require_service_packages("sweep", ("sqlalchemy", "alembic"))  # its registry is the job service's store
    from rlft.sweep.execute import Sweep
    from rlft.sweep.registry import REGISTRY_FILE, open_registry

    if args.summary is not None:
        return _report(Path(args.summary), args)
    options = _options(args)
    specs = _specs(args)
    sweep_dir = _sweep_dir(args)
    if args.resume and args.db is None and not (sweep_dir / REGISTRY_FILE).is_file():
        raise UsageError(f"--resume: {sweep_dir} is not a sweep directory (no {REGISTRY_FILE} in it)")
    store = open_registry(sweep_dir, args.db)
    try:
        sweep = Sweep(store, sweep_dir, options)
        tracks = sweep.plan(specs, resume=args.resume)
        where = " on Ray" if options.backend == "ray" else ""
        print(f"rlft sweep: {len(tracks)} runs in {sweep_dir} ({options.parallel} at a time{where})", file=sys.stderr)
        sweep.run(tracks)
    finally:
        store.close()
    code = _report(sweep_dir, args)
    return 130 if sweep.interrupted else code


def _options(args):
    from rlft.errors import UsageError
    from rlft.sweep.execute import SweepOptions
    from rlft.sweep.failures import parse_retry_on

    if args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: give 1 or more")
    if args.retries < 0:
        raise UsageError(f"--retries {args.retries}: give 0 or more")
    if args.backoff < 0:
        raise UsageError(f"--backoff {args.backoff}: give 0 or more seconds")
    check_backend_arguments(args)
    try:
        retry_on = parse_retry_on(args.retry_on)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return SweepOptions(
        parallel=args.parallel,
        retries=args.retries,
        retry_on=retry_on,
        backoff=args.backoff,
        fail_fast=args.fail_fast,
        backend=args.backend,
        ray_address=args.ray_address,
    )


def _specs(args):
    """The runs to plan: from the sources, from --config x --grid, or (--resume alone) from the registry."""
    from rlft.errors import UsageError
    from rlft.sweep.plan import from_grid, from_sources, parse_grid

    if args.sources and args.config:
        raise UsageError("give either FOLDER|CONFIG arguments or --config BASE (with --grid), not both")
    if args.grid and not args.config:
        raise UsageError("--grid needs --config BASE: the config the grid's values are set on")
    if args.config:
        return from_grid(args.config, parse_grid(args.grid), args.overrides)
    if args.sources:
        return from_sources(args.sources, args.overrides)
    if args.resume:
        if args.overrides:
            raise UsageError("--set with --resume alone: name the configs again to change them")
        return None
    raise UsageError(
        "nothing to run: give a folder of configs (rlft sweep configs/experiments/) or --config BASE --grid KEY=V1,V2"
    )


def _sweep_dir(args) -> Path:
    from rlft.errors import UsageError

    if args.out is None:
        if args.resume:
            raise UsageError("--resume needs --out DIR: the sweep directory to continue")
        return Path("sweeps") / time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file; give a directory")
    return out


def _report(sweep_dir: Path, args) -> int:
    """Write and print the summary of ``sweep_dir``; 0 if every run succeeded, else 1."""
    from rlft.errors import UsageError
    from rlft.sweep import summary
    from rlft.sweep.registry import REGISTRY_FILE, open_registry, sweep_id

    if args.db is None and not (sweep_dir / REGISTRY_FILE).is_file():
        raise UsageError(f"{sweep_dir}: no sweep registry here ({REGISTRY_FILE}); give the --out of a sweep")
    store = open_registry(sweep_dir, args.db)
    try:
        rows = summary.summarize(store, sweep_id(sweep_dir))
    finally:
        store.close()
    if not rows:
        raise UsageError(f"{sweep_dir}: the registry holds no runs of this sweep")
    files = summary.write_reports(rows, sweep_dir)
    plots, why_not = ([], "--no-plots") if args.no_plots else summary.write_plots(rows, sweep_dir)
    if args.json:
        print(json.dumps(summary.as_json(rows, sweep_dir, files + plots), indent=2))
    else:
        summary.print_table(rows, sweep_dir)
        print("\n".join(f"wrote {p}" for p in files))
        if plots:
            print(f"wrote {len(plots)} plots in {sweep_dir / 'plots'}")
        elif why_not:
            print(f"no plots: {why_not}")
        dirs = " ".join(r.run_dir for r in rows if (Path(r.run_dir) / "metrics.jsonl").is_file())
        if dirs:
            print(f"overlay the curves again with: rlft plot {dirs} --out {sweep_dir / 'plots'}")
    return 0 if summary.succeeded(rows) else 1
