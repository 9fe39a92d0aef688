"""Where an rlft GRPO step spends its time: the torch profiler's table of one step of the benchmark workload.

On a CPU the table is sorted by the operators' own CPU time; on a CUDA GPU by their own GPU time, with the
number of GPU kernels the step launched. A CUDA graph replays its kernels out of the profiler's sight, so
``--no-cuda-graphs`` profiles the decode kernel by kernel: how many small kernels a token takes, and how
long each runs, which the graph's replay does not remove.

python benchmarks/profile_step.py [--model smollm2-135m-instruct] [--rows 25] [--dtype bf16] [--max-new-tokens 256]
python benchmarks/profile_step.py --device cuda --dtype bf16 --shape smollm2-1.7b --prompts 8 --max-new-tokens 128 \
    --no-cuda-graphs --json profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import add_one_run_arguments, one_run_opts, rlft_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_one_run_arguments(ap)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=2, help="timed steps before the profiled one")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="the decode kernel by kernel (rollout.cuda_graphs)")
    ap.add_argument("--compile-decode", action="store_true", help="rollout.compile_decode: true")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--shapes", type=int, default=0, help="also list the top N ops by input shape")
    ap.add_argument("--json", help="also write the step's times, the kernel count and the tables here")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from rlft import Trainer

    opts = one_run_opts(a, a.dtype, a.shape_overrides, not a.no_cuda_graphs, a.compile_decode)
    trainer = Trainer(config=rlft_config(opts, Path(tempfile.mkdtemp())))
    trainer.setup()
    steps = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        m = trainer.train_step()
        steps.append(time.perf_counter() - t0)
        print(f"step {steps[-1]:.2f}s (generation {m['generation_seconds']:.2f}s, update {m['update_seconds']:.2f}s)")
    cuda = a.device == "cuda"
    if a.json:  # the step times first: a profile whose tables outrun a time limit still leaves them
        Path(a.json).write_text(json.dumps({"step_seconds": steps, "options": vars(a)}, indent=1))
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities, record_shapes=bool(a.shapes)) as prof:
        with record_function("train_step"):
            trainer.train_step()
        if cuda:
            torch.cuda.synchronize()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    tables = {"by_operator": prof.key_averages().table(sort_by=sort, row_limit=a.rows)}
    if a.shapes:
        tables["by_shape"] = prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=a.shapes)
    for table in tables.values():
        print(table)
    kernels = [e for e in prof.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    if cuda:
        print(f"GPU kernels in the profiled step: {len(kernels)}, {sum(e.device_time for e in kernels) / 1e3:.1f} ms")
    if a.json:
        out = {"step_seconds": steps, "gpu_kernels": len(kernels), "tables": tables, "options": vars(a)}
        out["gpu_kernel_ms"] = sum(e.device_time for e in kernels) / 1e3
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
