"""How close ``rlft estimate`` comes to the peak memory a run really reaches.

    python benchmarks/memory_estimate.py                 # every case (about 10 min on 2 CPU cores)
    python benchmarks/memory_estimate.py --only tiny     # the cases whose name contains "tiny"

Each case is a real ``rlft train`` process (2 steps of GRPO, 2 prompts x 8 completions that all
run to ``max_new_tokens``, evaluation off) and a separate ``rlft estimate --json`` process on the
same config. Measured: the training process's peak resident set size over its steps (the
``peak_mem_mb`` metric: getrusage's ru_maxrss at the end of each step), and over its whole life
(os.wait4, the final checkpoint's save included). The goal is estimate / measured in [1.0, 1.3]
for every case: never under, at most 30 % over.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

BASE = {
    "algorithm": {"name": "grpo", "rollout_batch_size": 2, "num_generations": 8, "learning_rate": 1e-6},
    "train": {"max_steps": 2, "logging_interval": 1, "save_interval": 1000, "progress_bar": "off"},
    "eval": {"before_training": False, "after_training": False},
}

REWARD_MODEL = "<reward model>"  # in a case's overrides: the built-in model with a new score head, made once

# name -> (model, overrides). "tiny" is a random 4-layer Llama of hidden size 256; "135m" the built-in SmolLM2.
CASES: dict[str, tuple[str, dict]] = {
    "tiny fp32 full kl0 32": (
        "tiny",
        {"model.dtype": "fp32", "algorithm.kl_coef": 0.0, "algorithm.max_new_tokens": 32},
    ),
    "tiny bf16 full kl 256": ("tiny", {"algorithm.kl_coef": 0.04, "algorithm.max_new_tokens": 256}),
    "135m bf16 full kl 32": ("135m", {"algorithm.kl_coef": 0.04, "algorithm.max_new_tokens": 32}),
    "135m bf16 full kl0 256": ("135m", {"algorithm.kl_coef": 0.0, "algorithm.max_new_tokens": 256}),
    "135m bf16 lora kl 256": (
        "135m",
        {"algorithm.kl_coef": 0.04, "algorithm.max_new_tokens": 256, "model.lora": {"r": 16}},
    ),
    "135m fp32 full kl 32 ckpt": (
        "135m",
        {
            "model.dtype": "fp32",
            "algorithm.kl_coef": 0.04,
            "algorithm.max_new_tokens": 32,
            "model.gradient_checkpointing": True,
        },
    ),
    "135m bf16 full kl 256 ckpt": (
        "135m",
        {"algorithm.kl_coef": 0.04, "algorithm.max_new_tokens": 256, "model.gradient_checkpointing": True},
    ),
    "135m fp32 full kl 256 selective": (
        "135m",
        {
            "model.dtype": "fp32",
            "algorithm.kl_coef": 0.04,
            "algorithm.max_new_tokens": 256,
            "model.gradient_checkpointing": "selective",
        },
    ),
    "135m bf16 full kl 256 selective": (
        "135m",
        {"algorithm.kl_coef": 0.04, "algorithm.max_new_tokens": 256, "model.gradient_checkpointing": "selective"},
    ),
    "135m fp32 lora kl0 32": (
        "135m",
        {"model.dtype": "fp32", "algorithm.kl_coef": 0.0, "algorithm.max_new_tokens": 32, "model.lora": {"r": 16}},
    ),
    # RLHF: SmolLM2-135M with a one-output score head as the reward model, beside the policy
    "135m bf16 full kl 32 reward model": (
        "135m",
        {
            "algorithm.kl_coef": 0.04,
            "algorithm.max_new_tokens": 32,
            "reward.functions+": {"type": "model", "name": "rm", "path": REWARD_MODEL, "output": "standardized"},
        },
    ),
}


def _set(tree: dict, dotted: str, value) -> None:
    """Set ``tree``'s ``dotted`` key to ``value``; a key ending in ``+`` appends ``value`` to its list."""
    *parents, last = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    if last.endswith("+"):
        tree[last[:-1]].append(value)
    else:
        tree[last] = value


def reward_model_dir(work: Path) -> Path:
    """The built-in model as a sequence classifier with one output (a new, seeded score head), once per run."""
    out = work / "reward-model"
    if not out.exists():
        import torch
        from transformers import AutoModelForSequenceClassification

        from rlft.models.loading import load_tokenizer
        from rlft.models.sources import resolve_model_dir

        src = resolve_model_dir("smollm2-135m-instruct")
        torch.manual_seed(0)
        tokenizer = load_tokenizer(src)
        model = AutoModelForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.float32)
        model.config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


def write_config(work: Path, model: str, overrides: dict) -> Path:
    from workload import TOPICS

    data = work / "prompts.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"prompt": f"Write a short story about {t}."}) + "\n" for t in TOPICS))
    cfg = json.loads(json.dumps(BASE))
    cfg["model"] = {"path": model}
    cfg["data"] = {"train_file": str(data)}
    # a reward with spread inside every group, so every row takes part in the update
    cfg["reward"] = {
        "functions": [
            {"type": "custom", "name": "e_density", "function": f"{ROOT / 'benchmarks' / 'workload.py'}:e_density"}
        ]
    }
    cfg["train"]["output_dir"] = str(work / "runs")
    for key, value in overrides.items():
        if isinstance(value, dict) and value.get("path") == REWARD_MODEL:
            value = {**value, "path": str(reward_model_dir(work))}
        _set(cfg, key, value)
    new = cfg["algorithm"]["max_new_tokens"]
    cfg["algorithm"]["min_new_tokens"] = new  # every completion runs to the limit: the worst case
    path = work / f"config-{len(list(work.glob('config-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def measure(config: Path) -> tuple[float, float]:
    """(peak RSS over the steps, peak RSS of the whole process), in bytes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlft.cli.main", "train", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"training failed for {config}:\n{err[-3000:]}")
    runs = sorted((config.parent / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    rows = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines()]
    return max(r["peak_mem_mb"] for r in rows) * 2**20, usage.ru_maxrss * 1024


def estimate(config: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "rlft.cli.main", "estimate", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
    )
    if out.returncode not in (0, 1):
        raise SystemExit(f"estimate failed for {config}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Run only the cases whose name contains this.")
    parser.add_argument("--out", default=None, help="Also write the table as JSON here.")
    parser.add_argument(
        "--reuse",
        default=None,
        help="Take the measured peaks from this earlier --out file "
        "(cases with the same name and overrides) and only estimate again: for tuning the model.",
    )
    args = parser.parse_args()
    earlier = {}
    if args.reuse:
        earlier = {
            (r["case"], json.dumps(r["overrides"], sort_keys=True)): r for r in json.loads(Path(args.reuse).read_text())
        }
    from rlft.models.precision import cpu_has_native_bf16
    from rlft.models.tiny import build_tiny_model_dir

    print(f"CPU bf16 native: {cpu_has_native_bf16()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny = build_tiny_model_dir(work / "tiny", hidden_size=256, num_layers=4)
        print(f"{'case':<30} {'estimate':>9} {'phase':>10} {'steps':>9} {'ratio':>6} {'process':>9} {'ratio':>6}")
        for name, (model, overrides) in CASES.items():
            if args.only not in name:
                continue
            config = write_config(work, str(tiny) if model == "tiny" else "smollm2-135m-instruct", overrides)
            est = estimate(config)
            old = earlier.get((name, json.dumps(overrides, sort_keys=True)))
            steps, whole = (old["measured_steps"], old["measured_process"]) if old else measure(config)
            peak = est["peak_bytes"]
            results.append(
                {
                    "case": name,
                    "overrides": overrides,
                    "estimate": peak,
                    "peak_phase": est["peak_phase"],
                    "measured_steps": steps,
                    "measured_process": whole,
                    "ratio": peak / steps,
                    "ratio_process": peak / whole,
                    "totals": est["totals"],
                }
            )
            print(
                f"{name:<30} {peak / 2**30:>8.2f}G {est['peak_phase']:>10} {steps / 2**30:>8.2f}G "
                f"{peak / steps:>6.2f} {whole / 2**30:>8.2f}G {peak / whole:>6.2f}",
                flush=True,
            )
    ratios = [r["ratio"] for r in results]
    if ratios:
        print(
            f"ratio estimate/measured over the steps: min {min(ratios):.2f}, max {max(ratios):.2f} "
            f"(goal: every one in [1.00, 1.30])"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
