"""Train one config on several seeds, one after another, and print the held-out accuracy table.

    .venv/bin/python scripts/seed_table.py configs/minimal_example.yaml --seeds 0 1 2 3 4
    .venv/bin/python scripts/seed_table.py configs/minimal_example.yaml --seeds 0 1 2 \\
        --set data.train_file=data/counting_train.jsonl --set data.eval_file=data/counting_eval.jsonl
    .venv/bin/python scripts/seed_table.py configs/agent_calculator.yaml --sft configs/calculator_sft.yaml --seeds 0 1 2

Each seed is a plain ``rlft train --config CONFIG --set train.seed=N`` into OUT/<tag>-seedN (``--set``
values are passed through). The table has the held-out accuracy at every evaluation, the final one and
the training time the run's log reports (model load, evaluation and checkpoints not counted). Runs that
already finished in OUT are read, not trained again, so an interrupted table picks up where it stopped.
With ``--sft SFT_CONFIG`` the warm start is trained once (``rlft sft``, its own seed) and every seed's RL
starts from its last checkpoint, so the first evaluation (step 0) is the warm start's accuracy.
Run it alone on the machine: the training times are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

RLFT = str(Path(sys.executable).with_name("rlft"))


def run_seed(config: str, seed: int, out: Path, tag: str, sets: list[str]) -> Path:
    run_dir = out / f"{tag}-seed{seed}"
    if _finished(run_dir):
        return run_dir
    if run_dir.exists():  # an earlier try that did not finish: start it again in the same place
        shutil.rmtree(run_dir)
    cmd = [
        RLFT,
        "train",
        "--config",
        config,
        "--set",
        f"train.seed={seed}",
        "--set",
        f"train.output_dir={out}",
        "--set",
        f"train.run_name={run_dir.name}",
        "--set",
        "train.progress_bar=off",
        "--set",
        "train.save_interval=100000",
        "--set",
        "train.save_optimizer=false",
    ]  # a table of runs: weights only
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"seed {seed} failed ({proc.returncode}) after {time.time() - t0:.0f}s:\n{proc.stderr[-3000:]}")
    return run_dir


def warm_start(sft_config: str, out: Path) -> str:
    """Train the SFT warm start into OUT once (again only if it did not finish); its last checkpoint."""
    run_dir = out / _run_name(sft_config)
    if not _finished(run_dir):
        proc = subprocess.run(
            [RLFT, "sft", "--config", sft_config, "--output-dir", str(out), "--set", "train.progress_bar=off"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0:
            sys.exit(f"the warm start {sft_config} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(checkpoints[-1])


def _run_name(config: str) -> str:
    import yaml

    return yaml.safe_load(Path(config).read_text())["train"]["run_name"]


def _finished(run_dir: Path) -> bool:
    info = run_dir / "run.json"
    return info.exists() and json.loads(info.read_text()).get("status") == "completed"


def read_run(run_dir: Path) -> dict:
    """Accuracy at each eval step (step 0 = before training) and the reported training minutes."""
    evals = sorted(
        (int(p.stem.split("-")[1]), json.loads(p.read_text())["accuracy"])
        for p in (run_dir / "eval").glob("step-*.json")
    )
    log = (run_dir / "train_log.log").read_text()
    minutes = re.findall(r"([\d.]+) min of training time", log)
    return {
        "evals": evals,
        "final": evals[-1][1] if evals else float("nan"),
        "minutes": float(minutes[-1]) if minutes else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE passed to rlft train")
    ap.add_argument("--out", default="outputs/seed_table", help="where the runs go")
    ap.add_argument("--tag", default=None, help="run-name prefix (default: the config's file name)")
    ap.add_argument("--sft", default=None, help="an SFT config: train this warm start once, start every seed from it")
    args = ap.parse_args()
    out, tag = Path(args.out), args.tag or Path(args.config).stem
    if args.sft:
        args.sets.append(f"model.path={warm_start(args.sft, out)}")
    rows = []
    for seed in args.seeds:
        row = read_run(run_seed(args.config, seed, out, tag, args.sets))
        curve = " -> ".join(f"{a:.0%}" for _, a in row["evals"])
        print(f"seed {seed}: {curve}  ({row['minutes']:.1f} min of training)", flush=True)
        rows.append(row)
    finals = [r["final"] for r in rows]
    print()
    print("| seed | " + " | ".join(str(s) for s in args.seeds) + " | mean | min |")
    print("|---|" + "---|" * (len(args.seeds) + 2))
    print(
        "| held-out accuracy | "
        + " | ".join(f"{f:.0%}" for f in finals)
        + f" | {statistics.mean(finals):.1%} | {min(finals):.0%} |"
    )
    print(
        "| training minutes | "
        + " | ".join(f"{r['minutes']:.1f}" for r in rows)
        + f" | {statistics.mean(r['minutes'] for r in rows):.1f} | |"
    )


if __name__ == "__main__":
    main()
