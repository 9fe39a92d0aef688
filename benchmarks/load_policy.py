"""How long a run takes to load its policy, and the most host and GPU memory the load holds.

The policy is loaded as a run loads it (``rlft.trainer.parts.build_model``: the tokenizer, the weights
onto the device, LoRA, a LoRA base's Linears kept in bf16 where the run computes in bf16), each round in a
fresh process, so the peak resident memory is the load's own (every weight read once after it). A model of
a ``--shape`` is written once with seeded random weights in ``--save-dtype`` (checkpoints people download
are bf16). To compare two versions of rlft, run it once with each on the path, alone on the machine:

    PYTHONPATH=/path/to/old/src python benchmarks/load_policy.py --shape smollm2-1.7b --lora-rank 16
    PYTHONPATH=src python benchmarks/load_policy.py --shape smollm2-1.7b --lora-rank 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_step import _resolve_model  # noqa: E402

CHILD = """
import json, resource, sys, time
import torch
from rlft.config.schema import ModelConfig
from rlft.trainer.parts import build_model

path, device, lora = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = ModelConfig(path=path, dtype="bf16", device=device, lora={"r": lora, "alpha": 2 * lora} if lora else None)
start = time.perf_counter()
parts = build_model(cfg)
if device == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
gpu = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
kept = sum(t.numel() * t.element_size() for t in [*parts.model.parameters(), *parts.model.buffers()]) / 2**20
# a CPU weight kept in its checkpoint's dtype is a view of the file, read at its first use: read it all now, so
# the peak counts it as a step's would
torch.stack([p.float().sum() for p in parts.model.parameters()]).sum().item()
print(json.dumps({"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_gpu_mb": gpu, "kept_mb": kept}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    ap.add_argument("--shape", help="a model of this size (benchmarks/shapes.py) with --model's tokenizer")
    ap.add_argument("--shape-overrides", help="JSON of config fields set after --shape's")
    ap.add_argument("--save-dtype", choices=["fp32", "bf16"], default="bf16", help="how --shape's weights are saved")
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write every round and the medians here")
    a = ap.parse_args(argv)
    overrides = json.loads(a.shape_overrides) if a.shape_overrides else None
    model_dir = _resolve_model(a.model, False, a.shape, overrides, a.device, a.save_dtype)  # as grpo_step.py: shared
    import rlft

    print(f"rlft from {Path(rlft.__file__).parent}; model {model_dir}; device {a.device}; LoRA r={a.lora_rank}")
    runs = []
    for i in range(a.rounds):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, model_dir, a.device, str(a.lora_rank)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        gpu = f", peak GPU {runs[-1]['peak_gpu_mb']:.0f} MB" if runs[-1]["peak_gpu_mb"] is not None else ""
        print(
            f"  round {i + 1}: {runs[-1]['seconds']:.2f} s, peak RSS {runs[-1]['peak_rss_mb']:.0f} MB{gpu} "
            f"(the model keeps {runs[-1]['kept_mb']:.0f} MB)"
        )
    med = {k: statistics.median(r[k] for r in runs) for k in ("seconds", "peak_rss_mb")}
    print(f"median: {med['seconds']:.2f} s, peak RSS {med['peak_rss_mb']:.0f} MB")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": model_dir, "lora_rank": a.lora_rank, "rounds": runs, **med}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
