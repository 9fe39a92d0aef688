"""The update's (or the rollout's) peak of live tensor bytes on the CPU, beside what `rlft estimate` plans for
it on a GPU.

A GPU's `max_memory_allocated` counts the bytes of live tensors; a CPU's resident set (what
`benchmarks/memory_estimate.py` measures, and what the planner's constants were fitted on) also keeps what
glibc did not hand back. This counts the first on a CPU: one GRPO step of a random-weight model of a shape
of `benchmarks/shapes.py` (fewer layers, so that it fits here), its update under the torch profiler's
memory events (every allocation and free), and prints the peak above the update's start (gradients,
activations, the head's log-probs) with the estimate's terms for the same config on an H200. Two depths
give the cost of a layer. The update runs in one pass, as the H200's estimate plans it (a CPU's own
``micro_batch_size: auto`` would split a batch of more than 4,096 tokens into passes). ``--gpu-attention``
runs the update's attention through PyTorch's SDPA, as on a GPU, instead of rlft's CPU kernels
(``train.native_kernels: false``): its fused kernel keeps what a GPU's keeps for the backward (inputs,
output, log-sum-exp), so the live tensors are those of a GPU's update.

``--phase rollout`` measures a rollout instead (``NativeEngine.generate``: the decode weights' refresh, the
prefill and the decode), on the GPU's path: the fixed batch a CUDA graph replays (run eagerly), nothing packed,
the bf16 decode copy or, with ``--no-decode-copy`` and LoRA, the base read in place with the adapters unmerged;
beside the estimate's rollout terms (decode weights, KV cache, prefill, logits).

    python benchmarks/update_allocated.py [--shape smollm2-1.7b] [--layers 2 4] [--new-tokens 64]
        [--recompute selective] [--lora-rank 16] [--gpu-attention] [--phase rollout] [--no-decode-copy]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def update_peak(update) -> int:
    """Bytes: the highest total of live tensors ``update()`` reaches above its start (CPU allocations)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        update()
    live = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        # an op's own allocations less its own frees; "[memory]" is a free outside any op
        live += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(config: dict, phase: str = "update") -> int:
    """One warm-up step, then the peak of the second step's update or rollout (:func:`update_peak`)."""
    import rlft.rl.update as update_module
    import rlft.rollout.native_engine as native_engine
    from rlft import Trainer

    owner, name = (
        (update_module.PolicyUpdater, "update") if phase == "update" else (native_engine.NativeEngine, "generate")
    )
    real, peaks = getattr(owner, name), []

    def profiled(self, *args, **kwargs):
        out = {}
        peaks.append(update_peak(lambda: out.setdefault("result", real(self, *args, **kwargs))))
        return out["result"]

    trainer = Trainer(config=config)
    trainer.setup()
    trainer.train_step()
    setattr(owner, name, profiled)
    try:
        trainer.train_step()
    finally:
        setattr(owner, name, real)
    return peaks[-1]


def as_on_a_gpu() -> None:
    """The native engine's decode as on a GPU: the fixed batch a CUDA graph replays (run eagerly here) over
    weights nothing packs (the bf16 decode copy, or a LoRA base read in place)."""
    import rlft.rollout.native_engine as native_engine
    from rlft.speed import packed_matmul
    from rlft.speed.graphed_rows import GraphedRows

    native_engine.graphs_apply = lambda device: True
    native_engine.GraphedRows = lambda *args, **kw: GraphedRows(*args, graphs=False, **kw)
    packed_matmul.can_pack = lambda dtype, device: False


TERMS = {  # what each phase adds to the states kept between steps, by the estimate's names
    "update": ("activations", "gradients", "logits"),
    "rollout": ("decode weights", "kv cache", "prefill", "logits", "lora merge"),
}


def planned(config_path: Path, phase: str = "update") -> dict[str, float]:
    """`rlft estimate --device H200-141GB`'s terms of ``phase`` for the config, in GiB; for the rollout, its decode
    weights less what the update keeps of them (already there when a rollout starts)."""
    command = ["estimate", "--config", str(config_path), "--device", "H200-141GB", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "rlft.cli.main", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    phases = json.loads(out.stdout)["phases"]
    terms = {k: v / 2**30 for k, v in phases[phase].items()}
    if phase == "rollout":
        terms["decode weights"] -= phases["update"]["decode weights"] / 2**30
    return terms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-1.7b")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--recompute", default="selective", choices=["selective", "off", "full"])
    ap.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (alpha 2r)")
    ap.add_argument("--gpu-attention", action="store_true", help="attention through SDPA, as on a GPU")
    ap.add_argument("--model", default="gpu-carry/model", help="a directory with SmolLM2's config and tokenizer")
    ap.add_argument("--phase", choices=["update", "rollout"], default="update")
    ap.add_argument("--no-decode-copy", action="store_true", help="rollout.decode_copy: false (LoRA: unmerged)")
    a = ap.parse_args(argv)
    if a.phase == "rollout":
        as_on_a_gpu()
    import yaml
    from grpo_step import rlft_config
    from shapes import random_model_dir

    lora = f", LoRA r={a.lora_rank}" if a.lora_rank else ""
    attention = "SDPA (a GPU's)" if a.gpu_attention else "rlft's CPU kernels"
    what = f"attention {attention}" if a.phase == "update" else "the GPU's decode path"
    what += ", no decode copy" if a.no_decode_copy else ""
    print(f"{a.shape}, 2 prompts x 8 completions x {a.new_tokens} tokens, bf16, recompute {a.recompute}{lora}, {what}")
    for layers in a.layers:
        model = random_model_dir(Path(a.model), a.shape, {"num_hidden_layers": layers}, "cpu", "bf16")
        work = Path(tempfile.mkdtemp())
        opts = dict(
            model_dir=str(model),
            dtype="bf16",
            device="cpu",
            prompts=2,
            group_size=8,
            max_new_tokens=a.new_tokens,
            beta=0.04,
            fixed_length=True,
            engine="native",
            threads=2,
            gradient_checkpointing=a.recompute,
            lora_rank=a.lora_rank or None,
            micro_batch=16,  # one pass, as on the GPU
        )
        config = rlft_config(opts, work)
        config["train"]["native_kernels"] = not a.gpu_attention
        config["rollout"]["decode_copy"] = not a.no_decode_copy
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        peak = measure(config, a.phase) / 2**30
        plan = planned(work / "config.yaml", a.phase)
        above = {k: v for k, v in plan.items() if k in TERMS[a.phase]}
        terms = ", ".join(f"{k} {v:.3f}" for k, v in above.items())
        print(
            f"  {layers} layers: live tensors' peak above the {a.phase}'s start {peak:.3f} GiB; the estimate's "
            f"{sum(above.values()):.3f} GiB ({terms}): {sum(above.values()) / peak:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
