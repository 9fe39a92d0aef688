"""The shared GRPO benchmark workload: prompts, reward and arithmetic, identical for rlft and TRL."""

from __future__ import annotations

import time
from pathlib import Path

import torch

TOPICS = [
    "a lighthouse keeper",
    "a lost robot",
    "the first snow of winter",
    "a market at dawn",
    "a cat who learns to read",
    "an old bridge",
    "a violin maker",
    "a storm at sea",
    "a garden on the moon",
    "two rival bakers",
    "a forgotten library",
    "a train that never stops",
    "a city of bicycles",
    "the last dragon",
    "a clock that runs backwards",
    "a letter from the future",
]


def prompts(tokenizer, count: int) -> list[str]:
    """``count`` chat-formatted story requests (plain text if the tokenizer has no chat template)."""
    out = []
    for i in range(count):
        text = f"Write a short story about {TOPICS[i % len(TOPICS)]}."
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        out.append(text)
    return out


def e_density(prompts, completions, **kwargs) -> list[float]:
    """A cheap reward with spread inside every group: the share of the letter 'e'. TRL signature."""
    return [c.count("e") / max(len(c), 1) for c in completions]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak_tflops(dtype: torch.dtype, size: int | None = None, seconds: float = 1.5, device: str = "cpu") -> float:
    """Measured matrix-multiply throughput of this machine for ``dtype`` (TFLOP/s): 1024-square
    products on a CPU, 8192-square on a GPU (smaller ones leave a GPU's tensor cores half idle)."""
    size = size or (8192 if device.startswith("cuda") else 1024)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    a @ b
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
        _sync(device)
    return 2 * size**3 * n / (time.perf_counter() - t0) / 1e12


def matmul_params(model_dir: str | Path) -> tuple[int, int, int]:
    """(matmul weights touched per token incl. the LM head, layers, hidden size) of a Llama-style config."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(model_dir))
    h, inter, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    kv = h // c.num_attention_heads * c.num_key_value_heads
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter
    return per_layer * layers + h * c.vocab_size, layers, h


def parameter_count(model_dir: str | Path) -> int:
    """Parameters of the model (tied embeddings counted once), from its safetensors headers."""
    from safetensors import safe_open

    total, seen = 0, set()
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k not in seen:
                    seen.add(k)
                    shape = st.get_slice(k).get_shape()
                    n = 1
                    for d in shape:
                        n *= d
                    total += n
    return total


def step_flops(
    model_dir,
    prompt_tokens: int,
    num_prompts: int,
    group: int,
    new_tokens: int,
    shared_prefill: bool,
    with_reference: bool,
    lora: bool = False,
) -> float:
    """Matmul FLOPs of one GRPO step: generation + reference forward + policy forward/backward (whose
    backward, with ``lora``, computes no gradient of the frozen weights: one forward's worth, not two).

    Each prompt is counted once per group with ``shared_prefill`` (what rlft executes), else once per
    completion (what a per-row implementation executes).  Attention score FLOPs are included.
    """
    w, layers, h = matmul_params(model_dir)
    rows = num_prompts * group
    prompt_rows = num_prompts if shared_prefill else rows
    tokens = prompt_rows * prompt_tokens + rows * new_tokens
    ctx = prompt_tokens + new_tokens / 2  # mean attended context of a completion token
    attn = 4 * layers * h * (prompt_rows * prompt_tokens * prompt_tokens / 2 + rows * new_tokens * ctx)
    forward = 2 * w * tokens + attn
    passes = 1 + (1 if with_reference else 0) + (2 if lora else 3)  # generation, reference, policy forward + backward
    return passes * forward


def memory_bandwidth_gbs(megabytes: int | None = None, seconds: float = 1.0, device: str = "cpu") -> float:
    """Measured memory read bandwidth (GB/s): summing a buffer far larger than any cache, as a decode
    step reads its weights (512 MB on a CPU, 4 GB on a GPU, whose L2 alone holds tens of MB)."""
    megabytes = megabytes or (4096 if device.startswith("cuda") else 512)
    x = torch.ones(megabytes * 2**20 // 2, dtype=torch.bfloat16, device=device)
    x.sum()
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x.sum()
        n += 1
        _sync(device)
    return x.numel() * 2 * n / (time.perf_counter() - t0) / 1e9
