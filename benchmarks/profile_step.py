"""Where an rlft GRPO step spends its time: torch profiler table of one step of the benchmark workload.

python benchmarks/profile_step.py [--model smollm2-135m-instruct] [--rows 25] [--dtype bf16] [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import _resolve_model, rlft_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--steps", type=int, default=2, help="timed steps before the profiled one")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--shapes", type=int, default=0, help="also list the top N ops by input shape")
    a = ap.parse_args()
    from torch.profiler import profile, record_function

    from rlft import Trainer

    opts = dict(
        model_dir=_resolve_model(a.model),
        dtype=a.dtype,
        prompts=2,
        group_size=8,
        max_new_tokens=a.max_new_tokens,
        beta=0.04,
        fixed_length=True,
        engine="native",
        threads=2,
    )
    trainer = Trainer(config=rlft_config(opts, Path(tempfile.mkdtemp())))
    trainer.setup()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        m = trainer.train_step()
        print(
            f"step {time.perf_counter() - t0:.2f}s (generation {m['generation_seconds']:.2f}s, "
            f"update {m['update_seconds']:.2f}s)"
        )
    with profile(record_shapes=True) as prof:
        with record_function("train_step"):
            trainer.train_step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))
    if a.shapes:
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=a.shapes))


if __name__ == "__main__":
    main()
