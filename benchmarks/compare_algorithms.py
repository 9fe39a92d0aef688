"""Train one config under several ``algorithm.name`` values with the same command; print a comparison table.

    python benchmarks/compare_algorithms.py                          # all algorithms, configs/minimal_example.yaml
    python benchmarks/compare_algorithms.py --names grpo rloo --steps 60 --config my.yaml

Each run is ``rlft train --config CONFIG --set algorithm.name=NAME ...`` in its own process (so peak
memory is its own), writing to <output_dir>/compare-NAME.  Everything else in the config is
shared, so the runs differ only in the name and the defaults it selects.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ALL = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"]
REPO = Path(__file__).resolve().parents[1]


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def run_one(config: Path, name: str, steps: int, extra: list[str]) -> dict:
    overrides = [
        f"algorithm.name={name}",
        f"train.run_name=compare-{name}",
        f"train.max_steps={steps}",
        "train.logging_interval=1",
        "eval.interval=0",
        *extra,
    ]
    cmd = [sys.executable, "-m", "rlft.cli.main", "train", "--config", str(config)]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_seconds": time.time() - t0}


def summarise(run_dir: Path, name: str, wall: float) -> str:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    task = cfg["eval"]["accuracy_reward"] or cfg["reward"]["functions"][0].get("name")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    key = f"reward/{task}/mean" if f"reward/{task}/mean" in rows[0] else "reward/mean"
    first, last = _mean([r[key] for r in rows[:5]]), _mean([r[key] for r in rows[-5:]])
    evals = sorted((json.loads(p.read_text()) for p in (run_dir / "eval").glob("step-*.json")), key=lambda e: e["step"])
    acc = f"{evals[0]['accuracy']:.0%} → {evals[-1]['accuracy']:.0%}" if len(evals) >= 2 else "n/a"
    secs = _mean([r["step_seconds"] for r in rows])
    peak = max(r["peak_mem_mb"] for r in rows)
    extra = ""
    if "critic/explained_variance" in rows[-1]:
        extra = f" expl. var {_mean([r['critic/explained_variance'] for r in rows[-5:]]):.2f}"
    if "dynamic_sampling/dropped_groups" in rows[-1]:
        extra += f" dropped {sum(r['dynamic_sampling/dropped_groups'] for r in rows):.0f} groups"
    return (
        f"| {name} | {len(rows)} | {first:.3f} → {last:.3f} | {acc} | {secs:.1f} | {wall / 60:.1f} | "
        f"{peak:.0f} |{extra} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "minimal_example.yaml"))
    ap.add_argument("--names", nargs="+", default=ALL, choices=ALL)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--set", dest="extra", action="append", default=[], help="further KEY=VALUE overrides for every run"
    )
    a = ap.parse_args(argv)
    config = Path(a.config).resolve()
    cfg = yaml.safe_load(config.read_text())
    out_dir = Path(cfg.get("train", {}).get("output_dir", "./outputs"))
    header = [
        "| algorithm | steps | task reward first 5 → last 5 | held-out accuracy before → after | s/step | "
        "wall min | peak RSS MB | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    for name in a.names:
        res = run_one(config, name, a.steps, a.extra)
        run_dir = (out_dir if out_dir.is_absolute() else Path.cwd() / out_dir) / f"compare-{name}"
        lines.append(summarise(run_dir, name, res["wall_seconds"]))
        print("\n".join(["", *header, *lines]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
