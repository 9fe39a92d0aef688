"""Prints the worked example's numbers from its run directories (outputs/rlhf/{rm,grpo})."""

import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/rlhf")


def evals(run):
    return [
        json.loads(p.read_text())
        for p in sorted((root / run / "eval").glob("step-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    ]


def metrics(run):
    return [json.loads(line) for line in (root / run / "metrics.jsonl").read_text().splitlines() if line.strip()]


rm = evals("rm")
print(
    f"reward model, held-out pairwise accuracy: {rm[0]['accuracy']:.1%} -> {rm[-1]['accuracy']:.1%} "
    f"({rm[-1]['num_pairs']} pairs)"
)
rows = metrics("grpo")
first, last = rows[0], rows[-1]
print(
    f"GRPO, reward-model score (raw logit, training batches): step {first['step']} {first['reward/rm/raw_mean']:+.2f}"
    f" -> step {last['step']} {last['reward/rm/raw_mean']:+.2f}"
)
print(f"GRPO, KL to the SFT model: max {max(r.get('kl', 0.0) for r in rows):.4f} over the run")
g = evals("grpo")
print(f"held-out reward-model score (greedy answers): {g[0]['rewards']['rm']:+.2f} -> {g[-1]['rewards']['rm']:+.2f}")
print(
    f"held-out rule (polite and concise, never trained on): {g[0]['accuracy']:.1%} -> {g[-1]['accuracy']:.1%} "
    f"({g[-1]['num_prompts']} prompts)"
)
