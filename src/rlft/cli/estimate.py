"""``rlft estimate --config X [--device cuda:0|cpu|H100-80GB] [--json]``: a run's predicted peak memory."""

from __future__ import annotations

import argparse
import json
import shlex

from rlft.cli.options import add_overrides


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="YAML config file.")
    add_overrides(p)
    p.add_argument(
        "--device",
        default=None,
        help="Plan for this device: cpu, cuda, cuda:N, or a named GPU such as H100-80GB, A100-40GB, "
        "T4-16GB (or a size: 24GB). Default: where the run would train.",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="Plan one process of a data-parallel run of N processes (torchrun --nproc_per_node x "
        "--nnodes): its share of each step, and under distributed.strategy fsdp2 its share of "
        "the trained state.",
    )
    p.add_argument("--json", action="store_true", help="Print the estimate as JSON.")


def run(args) -> int:
    from rlft.config.loader import load_config
    from rlft.planner.advice import advise
    from rlft.planner.estimate import estimate_memory, gb

    cfg = load_config(args.config, overrides=args.overrides)
    if args.processes < 1:
        from rlft.errors import UsageError

        raise UsageError(f"--processes {args.processes}: must be 1 or more")
    from rlft.distributed.strategy import strategy_named

    sharded = args.processes > 1 and strategy_named(cfg.distributed.strategy).shards
    est = estimate_memory(cfg, args.device, processes=args.processes, sharded=sharded)
    knobs = advise(cfg, est)
    if args.json:
        out = est.as_dict()
        out["advice"] = [{"set": k.setting, "cost": k.cost, "peak_bytes": k.peak} for k in knobs]
        print(json.dumps(out, indent=2))
        return 0 if est.fits else 1
    for line in est.lines():
        print(line)
    if knobs:
        print("to fit, apply in this order (each predicted peak includes the changes above it):")
        for i, k in enumerate(knobs, 1):
            print(f"  {i}. --set {shlex.quote(k.setting):<38} -> {gb(k.peak)}   ({k.cost})")
    return 0 if est.fits else 1
