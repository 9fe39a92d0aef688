"""Rollout speed of rlft's decode paths against the memory-bandwidth floor, alternating in one process.

Decoding one token reads every matmul weight once, so a decode step can be no faster than
(weight bytes) / (memory bandwidth). This script measures both on this machine and times the
native engine's prefill and decode for each variant, in turns (variant A, B, C, A, B, C, ...), so
drift of a shared machine hits all of them alike.

    python benchmarks/decode.py                                  # SmolLM2-135M, 2 prompts x 8, 32 tokens
    python benchmarks/decode.py --group-size 16 --max-new-tokens 128 --variants autocast copy

Variants: fp32-generic (fp32 through the model's own forward and a growing cache), fp32 (the fused
decode over a static cache, PyTorch ops between the matmuls), fp32-native (the same with rlft's
native CPU kernels between the matmuls and for sampling: the default in fp32), autocast (bf16
autocast over the fp32 weights: rlft before issue 12), copy-generic (the bf16 decode copy through
the model's forward), copy (bf16 weights with the fused decode, PyTorch ops between the matmuls),
copy-native (the same with the native kernels: the default with bf16; where the CPU has AVX512-BF16
and no AMX its matmuls are rlft's thin bf16 kernel), copy-native-onednn (the same with oneDNN's
matmuls instead of that kernel).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload  # noqa: E402

# name -> (autocast dtype, bf16 decode copy, fused decode, native kernels)
VARIANTS = {
    "fp32-generic": (None, False, False, False),
    "fp32": (None, False, True, False),
    "fp32-native": (None, False, True, True),
    "autocast": ("bf16", False, False, False),
    "copy-generic": ("bf16", True, False, False),
    "copy": ("bf16", True, True, False),
    "copy-native": ("bf16", True, True, True),
    "copy-native-onednn": ("bf16", True, True, True),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=sorted(VARIANTS))
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args(argv)
    import torch
    from grpo_step import _resolve_model

    from rlft.models.loading import load_tokenizer
    from rlft.rollout import NativeEngine, SamplingParams
    from rlft.speed.clock import CLOCK

    model_dir = _resolve_model(a.model)
    tok = load_tokenizer(model_dir)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engines = {
        v: NativeEngine(
            model,
            tok,
            max_prompt_length=512,
            autocast_dtype=torch.bfloat16 if VARIANTS[v][0] else None,
            decode_copy=VARIANTS[v][1],
            fused_decode=VARIANTS[v][2],
            native_kernels=VARIANTS[v][3],
        )
        for v in a.variants
    }
    if "copy-native-onednn" in engines and engines["copy-native-onednn"].kernels() is not None:
        onednn = copy.copy(engines["copy-native-onednn"].kernels())
        onednn.thin_bf16_matmul = False  # this engine's decoder multiplies oneDNN-packed weights
        engines["copy-native-onednn"].kernels = lambda: onednn
    prompts = workload.prompts(tok, a.prompts)
    T = a.max_new_tokens
    sampling = SamplingParams(max_new_tokens=T, min_new_tokens=T, n=a.group_size, seed=0)  # as the trainer draws
    weights, _, _ = workload.matmul_params(model_dir)
    bandwidth = workload.memory_bandwidth_gbs()
    print(f"machine: measured read bandwidth {bandwidth:.1f} GB/s; {weights / 1e6:.0f}M matmul weights")
    times: dict[str, dict[str, list[float]]] = {v: {"prefill": [], "decode": []} for v in a.variants}
    for r in range(a.rounds + 1):
        for v, engine in engines.items():
            CLOCK.reset()
            engine.generate(prompts, sampling)
            if r > 0:  # round 0 warms up
                for ph in ("prefill", "decode"):
                    times[v][ph].append(CLOCK.seconds[ph])
    print(f"\n{a.prompts} prompts x {a.group_size} completions, {T} new tokens, median of {a.rounds} rounds\n")
    print("| variant | prefill s | decode s | ms per decode step | weight bytes/step | GB/s | of bandwidth floor |")
    print("|---|---|---|---|---|---|---|")
    for v in a.variants:
        pre, dec = (statistics.median(times[v][ph]) for ph in ("prefill", "decode"))
        per_step = dec / T
        bytes_step = weights * (4 if VARIANTS[v][0] is None else 2)
        gbs = bytes_step / per_step / 1e9
        print(
            f"| {v} | {pre:.3f} | {dec:.3f} | {per_step * 1e3:.1f} | {bytes_step / 1e6:.0f} MB | {gbs:.1f} | "
            f"{gbs / bandwidth:.0%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
