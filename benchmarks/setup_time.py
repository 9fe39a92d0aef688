"""Where a GRPO run's start goes before its first step, on a dataset of a realistic size.

A run checks its memory plan (which measures the prompts), then loads the model and reads its data. With
the benchmark's 16 prompts (grpo_step.py) the data is nothing; with the 10,000-100,000 prompts of a real RL
dataset, rendering each with the chat template and tokenizing it takes seconds. This writes ``--prompts``
chat prompts of 20-80 words, sets up a run on them (rlft.Trainer.setup, no step) and prints the seconds of
each part and how many times a split's prompts were built (rendered and tokenized).

python benchmarks/setup_time.py [--prompts 20000] [--model smollm2-135m-instruct] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

WORDS = "the a cat dog number sum of what is find compute total apples each there are how many".split()


def write_prompts(path: Path, n: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80)))
            f.write(json.dumps({"prompt": [{"role": "user", "content": question}], "answer": str(i)}) + "\n")


def timed(module, name: str, seconds: dict, calls: dict) -> None:
    """Wrap ``module.name`` so that its calls and seconds are counted under ``name``."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - t
            calls[name] += 1

    setattr(module, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=20000)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=2, help="runs set up one after another in this process")
    a = ap.parse_args(argv)
    import rlft.data.prompts as prompts
    import rlft.planner.check as check
    import rlft.rl.job as rl_job
    from rlft import Trainer

    work = Path(tempfile.mkdtemp(prefix="rlft-setup-"))
    write_prompts(work / "train.jsonl", a.prompts)
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    timed(check, "check_memory", seconds, calls)
    timed(rl_job, "build_model", seconds, calls)
    timed(rl_job, "build_data", seconds, calls)
    timed(prompts, "build_examples", seconds, calls)
    for run in range(a.repeats):
        seconds.clear()
        calls.clear()
        config = {
            "model": {"path": a.model, "dtype": "bf16"},
            "data": {"train_file": str(work / "train.jsonl"), "eval_split": 0.05},
            "algorithm": {"name": "grpo", "rollout_batch_size": 2, "num_generations": 4, "max_new_tokens": 8},
            "reward": {"functions": [{"type": "exact_answer"}]},
            "train": {"output_dir": str(work / "out"), "run_name": f"run{run}", "progress_bar": "off"},
            "eval": {"before_training": False, "after_training": False},
        }
        t = time.perf_counter()
        Trainer(config=config).setup()
        total = time.perf_counter() - t
        print(
            f"run {run + 1}: setup {total:.2f} s, {a.prompts} prompts ({a.model}): memory check "
            f"{seconds['check_memory']:.2f} s, model {seconds['build_model']:.2f} s, "
            f"data {seconds['build_data']:.2f} s; "
            f"prompt splits built {calls['build_examples']} ({seconds['build_examples']:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
