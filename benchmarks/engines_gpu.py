"""GRPO step time and decode speed of the rollout engines on one CUDA GPU: vllm vs native vs hf.

Each engine trains in its own process (vLLM holds GPU memory and process-wide state, and a hung
engine is killed by the timeout without taking the others with it), on identical work: a tiny
random Llama written on the fly (no downloads; 512 wide, 4 layers, 128-wide heads, a character
vocabulary), bf16, 8 prompts x 8 completions of exactly ``--tokens`` new tokens (end-of-sequence is
suppressed until then), KL to the reference, one optimizer step per rollout batch.

    python benchmarks/engines_gpu.py                          # native, hf, vllm; 4 steps each
    python benchmarks/engines_gpu.py --engines vllm native --steps 6 --json out.json

Per engine, over the steps after the first (warm-up): median step seconds, median generation
seconds, decode tokens/s (completion tokens / generation seconds) and, where the engine reports
sampling log-probs, the mean engine-vs-trainer log-prob gap (``rollout/logprob_mismatch``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "hello there",
    "what is two plus two",
    "name a colour",
    "count to five",
    "a b c",
    "the sea is",
    "once upon a time",
    "say yes or no",
]


def config(engine: str, workdir: Path, model_dir: Path, steps: int, tokens: int, device: str = "cuda") -> dict:
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {
        "model": {"path": str(model_dir), "dtype": "bf16", "device": device, "gradient_checkpointing": False},
        "data": {"train_file": str(prompts), "use_chat_template": False},
        "algorithm": {
            "name": "grpo",
            "learning_rate": 1e-5,
            "kl_coef": 0.04,
            "rollout_batch_size": 8,
            "num_generations": 8,
            "max_new_tokens": tokens,
            "min_new_tokens": tokens,
            "temperature": 1.0,
        },
        "rollout": {"engine": engine},
        "reward": {"functions": [{"type": "contains", "keyword": "e"}]},
        "train": {
            "epochs": 1000,
            "max_steps": steps,
            "logging_interval": 1,
            "samples_per_log": 0,
            "save_interval": 100000,
            "progress_bar": "off",
            "output_dir": str(workdir / engine),
            "seed": 0,
        },
        "eval": {"before_training": False, "after_training": False, "interval": 0},
    }


def worker(engine: str, workdir: Path, steps: int, tokens: int, device: str) -> dict:
    """Train ``steps`` steps with ``engine``; the summary of the steps after the first."""
    from rlft import Trainer

    result = Trainer(config=config(engine, workdir, workdir / "model", steps, tokens, device)).train()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    completions = 8 * 8
    out = {
        "engine": engine,
        "steps_timed": len(rows),
        "step_seconds": statistics.median(r["step_seconds"] for r in rows),
        "generation_seconds": statistics.median(r["generation_seconds"] for r in rows),
        "decode_tokens_per_s": statistics.median(
            r["completion_len/mean"] * completions / r["generation_seconds"] for r in rows
        ),
    }
    if all("rollout/logprob_mismatch" in r for r in rows):
        out["logprob_mismatch"] = statistics.mean(r["rollout/logprob_mismatch"] for r in rows)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=["native", "hf", "vllm"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds for all engines; each may use what the ones after it leave (30 s each)",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda", help="cuda (the point); cpu only checks the harness (native, hf)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(
            "RESULT " + json.dumps(worker(args.worker, args.workdir, args.steps, args.tokens, args.device)), flush=True
        )
        return 0
    from rlft.models.tiny import build_tiny_model_dir

    workdir = Path(tempfile.mkdtemp(prefix="rlft-engines-"))
    build_tiny_model_dir(workdir / "model", hidden_size=512, num_layers=4)
    results, deadline = [], time.monotonic() + args.timeout
    for i, engine in enumerate(args.engines):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            engine,
            "--workdir",
            str(workdir),
            "--steps",
            str(args.steps),
            "--tokens",
            str(args.tokens),
            "--device",
            args.device,
        ]
        budget = max(deadline - time.monotonic() - 30.0 * (len(args.engines) - i - 1), 10.0)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
        except subprocess.TimeoutExpired:
            results.append({"engine": engine, "error": f"timed out after {budget:.0f}s"})
            continue
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        results.append(
            json.loads(line[7:])
            if line
            else {"engine": engine, "error": f"exit {proc.returncode}: " + proc.stderr.strip()[-800:]}
        )
    print(f"{'engine':8} {'step s':>8} {'gen s':>8} {'decode tok/s':>13} {'logprob gap':>12}")
    for r in results:
        if "error" in r:
            print(f"{r['engine']:8} FAILED {r['error']}")
            continue
        gap = f"{r['logprob_mismatch']:.2e}" if "logprob_mismatch" in r else "-"
        print(
            f"{r['engine']:8} {r['step_seconds']:8.3f} {r['generation_seconds']:8.3f} "
            f"{r['decode_tokens_per_s']:13.0f} {gap:>12}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
