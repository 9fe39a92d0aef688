"""How far the rollout engine's log-probs are from the trainer's, and from an fp32 forward on the same weights.

``rollout/logprob_mismatch`` (metrics.jsonl) is the mean |engine log-prob - trainer log-prob| of the sampled
tokens. In bf16 neither side is exact: this runs steps of the benchmark workload and, at each step's update,
also computes the sampled tokens' log-probs with autocast off (fp32 on the fp32 master weights), then prints
the distances a token, and that of an fp32 forward on the weights rounded to bf16 (what bf16 compute multiplies
by) from the fp32 one. Where the engine and the trainer are each as far from fp32 as from each other, the
mismatch is bf16's own rounding; an engine much further from fp32 than the trainer is would be a bug.

python benchmarks/logprob_mismatch.py [--model smollm2-135m-instruct] [--steps 3] [--max-new-tokens 32]
python benchmarks/logprob_mismatch.py --device cuda --shape smollm2-1.7b --prompts 8 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import add_one_run_arguments, one_run_opts, rlft_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_one_run_arguments(ap)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    import torch

    import rlft.algorithms.objective as objective
    import rlft.rl.batch as batch
    from rlft import Trainer

    opts = one_run_opts(a, "bf16", a.shape_overrides)
    seen: dict = {}
    trainer_logprobs, mismatch = batch.grouped_completion_logprobs, objective.logprob_mismatch

    def with_fp32(model, *args, **kwargs):
        out = trainer_logprobs(model, *args, **kwargs)
        if torch.is_grad_enabled() and "fp32" not in seen:  # the update's forward, before its optimizer step
            with torch.no_grad(), torch.autocast(a.device, enabled=False):
                seen["fp32"] = trainer_logprobs(model, *args, **kwargs)[0].float()
                master = [(p, p.detach().clone()) for p in model.parameters() if p.dtype == torch.float32]
                for p, _ in master:  # the weights bf16 compute sees, computed with in fp32
                    p.data.copy_(p.data.to(torch.bfloat16))
                try:
                    seen["bf16_weights"] = trainer_logprobs(model, *args, **kwargs)[0].float()
                finally:
                    for p, kept in master:
                        p.data.copy_(kept)
        return out

    def recorded(old, rollout, mask):
        seen.setdefault("pairs", (old.detach().float(), rollout.detach().float(), mask.float()))
        return mismatch(old, rollout, mask)

    batch.grouped_completion_logprobs, objective.logprob_mismatch = with_fp32, recorded
    try:
        rows = _steps(Trainer(config=rlft_config(opts, Path(tempfile.mkdtemp()))), a.steps, seen)
    finally:
        batch.grouped_completion_logprobs, objective.logprob_mismatch = trainer_logprobs, mismatch
    print(
        "| step | engine vs trainer (the logged mismatch) | trainer bf16 vs fp32 | engine vs fp32 "
        "| fp32 on the bf16-rounded weights vs fp32 | mean log-prob |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['step']} | {r['engine_vs_trainer']:.4f} | {r['trainer_vs_fp32']:.4f} | {r['engine_vs_fp32']:.4f} "
            f"| {r['bf16_weights_vs_fp32']:.4f} | {r['mean_logprob']:.3f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "options": vars(a)}, indent=1))
    return 0


def _steps(trainer, steps: int, seen: dict) -> list[dict]:
    """Each step's distances a token, from what its update's patched calls left in ``seen``."""
    trainer.setup()
    rows = []
    for step in range(1, steps + 1):
        seen.clear()
        logged = trainer.train_step()["rollout/logprob_mismatch"]
        old, rollout, mask = seen["pairs"]
        fp32 = seen["fp32"]

        def distance(x, y, mask=mask):
            return float(((x - y).abs() * mask).sum() / mask.sum())

        rows.append(
            {
                "step": step,
                "logged": float(logged),
                "engine_vs_trainer": distance(rollout, old),
                "trainer_vs_fp32": distance(old, fp32),
                "engine_vs_fp32": distance(rollout, fp32),
                "bf16_weights_vs_fp32": distance(seen["bf16_weights"], fp32),
                "mean_logprob": float((fp32 * mask).sum() / mask.sum()),
            }
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
