"""``rlft plot``: training curves of one or more run directories as PNG files.

    rlft plot outputs/run-a [outputs/run-b ...] --out plots/

Reads each run's ``metrics.jsonl`` and ``eval/step-N.json``; several runs are overlaid on the same
axes (the legend names each by its directory). Writes one PNG per panel that has data (reward,
zero_std, kl, entropy, length, clip_frac, lr, eval_accuracy, grad_norm, step_seconds) and
``overview.png`` with all of them; prints the paths written. See :mod:`rlft.logging.plots`.
"""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="Run directories (outputs/<run_name>, each holding metrics.jsonl); several are overlaid.",
    )
    p.add_argument("--out", default="plots", help="Directory for the PNG files (default: plots; created if missing).")
    p.add_argument("--dpi", type=int, default=120, help="Resolution of the PNG files (default 120).")


def run(args) -> int:
    from rlft.errors import UsageError
    from rlft.logging.plots import plot_runs

    if args.dpi < 10 or args.dpi > 1200:
        raise UsageError(f"--dpi {args.dpi}: give a value between 10 and 1200.")
    for path in plot_runs(args.run_dirs, args.out, dpi=args.dpi):
        print(path)
    return 0
