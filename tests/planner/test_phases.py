"""The GPU's activation terms count the tensors a GPU's update keeps, measured through its attention path."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

import rlft.speed.kernels as kernels_module
from rlft.planner import phases

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_gpu_allowance_counts_what_a_gpu_keeps(monkeypatch):
    """Bytes a decoder layer keeps a token and hidden unit for its backward, counted by benchmarks/recompute.py (every
    storage alive after the forward, 4 layers less 2) in bf16, with attention through SDPA: long enough rows for
    rlft's attention to call it (over 1M scores a call), grouped-query and GPU-like proportions."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import recompute

    monkeypatch.setattr(kernels_module, "_SWITCH", {"enabled": False})  # attention through SDPA, as on a GPU
    h, kv, inter = 256, 64, 704
    shape = {"hidden_size": h, "intermediate_size": inter, "num_attention_heads": 8, "num_key_value_heads": 2}
    batch = recompute._batch(2, 8, 16, 128)
    kept = {m: recompute.per_unit(shape, m, batch, "bf16", 0)[0] for m in recompute.MODES}
    gpu = phases.GPU_ALLOWANCE
    # selective and full: the tensors named (the fp32 input; the matmuls' outputs in bf16), and within 1 % the
    # attention's log-sum-exp and its small prompt blocks (whose scores a matmul computes, under 1M a call)
    assert kept["selective"] == pytest.approx(
        4 * gpu.sel_fp32_hidden + 2 * (phases.SEL_HIDDEN * h + 2 * kv + 2 * inter) / h, rel=0.01
    )
    assert kept["full"] == pytest.approx(4 * gpu.ckpt_fp32_hidden, rel=0.01)
    # nothing recomputed: the fp32 units are a fit, from above and within 10 %
    off = 4 * gpu.act_fp32_hidden + 2 * (phases.ACT_HIDDEN * h + phases.ACT_INTER * inter) / h
    assert kept["off"] <= off < 1.1 * kept["off"]
    # the CPU's allowance, fitted on resident sets, counts more than these live tensors
    assert phases.CPU_ALLOWANCE.sel_fp32_hidden > gpu.sel_fp32_hidden


def test_a_gpu_estimate_counts_activations_by_the_gpu_allowance():
    from rlft.planner.shape import ModelShape

    shape = ModelShape(
        params=10**9,
        trainable=10**9,
        layers=4,
        hidden=256,
        intermediate=704,
        heads=8,
        kv_heads=2,
        head_dim=32,
        vocab=1000,
        linear_params=9 * 10**8,
        untied_linear_params=9 * 10**8,
        tied_embeddings=True,
        model_type="llama",
    )

    cuda = phases.Geometry(16, 2, 16, 128, 16, compute_bytes=2, recompute="selective", group=8, device_kind="cuda")
    tokens = cuda.forward_tokens
    per_layer = 4 * 1 * 256 + (4 * 256 + 2 * 64 + 2 * 704) * 2  # the GPU's selective layer, bytes a token
    replayed = 4 * 9 * 256 + (256 + 4 * 704) * 2  # one layer's forward, replayed in the backward
    gpu = phases.update_bytes(shape, cuda)["activations"]
    assert gpu == int(phases.GPU_ALLOWANCE.margin[2] * tokens * (4 * per_layer + replayed))
    assert phases.update_bytes(shape, replace(cuda, device_kind="cpu"))["activations"] > gpu
