"""What memory a run may use: this machine's CPU or GPU, or a named GPU to plan for elsewhere.

On a CPU the limit is the smaller of the machine's RAM and the process's cgroup memory limit
(a container's ``--memory``), since the kernel's OOM killer acts on the smaller. A GPU's is its
total memory less what the CUDA context itself takes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

GiB = 2**30

# Usable memory of common GPUs, by the names people write (``rlft estimate --device H100-80GB``).
CATALOG: dict[str, float] = {
    "H200-141GB": 141,
    "H100-94GB": 94,
    "H100-80GB": 80,
    "A100-80GB": 80,
    "A100-40GB": 40,
    "L40S-48GB": 48,
    "A6000-48GB": 48,
    "A10G-24GB": 24,
    "L4-24GB": 24,
    "RTX4090-24GB": 24,
    "RTX3090-24GB": 24,
    "T4-16GB": 16,
    "V100-32GB": 32,
    "V100-16GB": 16,
}
CUDA_CONTEXT_BYTES = int(0.5 * GiB)
RUN_OVERHEAD_BYTES = 100 * 2**20  # what a CPU run adds to its imports as it goes (python_runtime_bytes)
# The least a CPU training process holds beside its tensors: 0.45 GiB was measured on AVX2 and in fp32; with native
# bf16, oneDNN's and rlft's bf16 kernels add to it (benchmarks/memory_estimate.py's tiny bf16 case, 2026-12-06).
MIN_CPU_RUNTIME_BYTES = int(0.5 * GiB)


@dataclass(frozen=True)
class DeviceSpec:
    """``kind``: cpu or cuda; ``total``: bytes a run may use there; ``runtime``: bytes the process
    takes before any model (the interpreter and libraries on a CPU, the CUDA context on a GPU)."""

    name: str
    kind: str
    total: int
    runtime: int


def describe_device(name: str | None, model_device: str = "auto") -> DeviceSpec:
    """The device ``name`` names (``cpu``, ``cuda``, ``cuda:N`` or a catalog entry), or where a run
    with ``model.device: model_device`` would train."""
    if name is None:
        name = model_device
    if name == "auto":
        import torch

        name = "cuda:0" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return DeviceSpec("cpu", "cpu", cpu_memory_limit(), python_runtime_bytes())
    if name.startswith("cuda"):
        import torch

        index = int(name.partition(":")[2] or 0) if name.partition(":")[2].isdigit() else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            from rlft.errors import UsageError

            raise UsageError(
                f"{name}: this machine has {torch.cuda.device_count()} CUDA device(s); to plan for a "
                f"GPU elsewhere name it, e.g. --device H100-80GB or --device 24GB"
            )
        props = torch.cuda.get_device_properties(index)
        return DeviceSpec(f"{props.name} ({name})", "cuda", props.total_memory, CUDA_CONTEXT_BYTES)
    key = _catalog_key(name)
    if key is None:
        from rlft.errors import UsageError

        raise UsageError(
            f"unknown device {name!r}: use cpu, cuda, cuda:N, or one of {', '.join(CATALOG)} (or a size such as 24GB)"
        )
    gigabytes = CATALOG.get(key) or float(re.fullmatch(r"(\d+(?:\.\d+)?)GB", key).group(1))
    return DeviceSpec(key, "cuda", int(gigabytes * 1e9), CUDA_CONTEXT_BYTES)


def _catalog_key(name: str) -> str | None:
    wanted = name.upper().replace(" ", "").replace("_", "-")
    for key in CATALOG:
        if key.upper() == wanted:
            return key
    if re.fullmatch(r"\d+(?:\.\d+)?GB", wanted):
        return wanted
    return None


def cpu_memory_limit() -> int:
    """Physical RAM, or the cgroup's memory limit when that is lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * GiB
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def python_runtime_bytes() -> int:
    """What an rlft training process holds beside its tensors: the interpreter, torch, transformers
    and their libraries (resident pages of this process, which has imported them), plus what a run
    adds as it goes (thread stacks and arenas, oneDNN's kernels, tokenizer caches: 100 MB measured
    on a tiny model), at least :data:`MIN_CPU_RUNTIME_BYTES`."""
    import psutil
    import torch  # noqa: F401  (imported, so its libraries count)
    import transformers  # noqa: F401

    return max(psutil.Process().memory_info().rss + RUN_OVERHEAD_BYTES, MIN_CPU_RUNTIME_BYTES)


def dtype_bytes(requested: str, kind: str) -> int:
    """The bytes a matmul operand takes for a ``dtype`` setting (``auto``, ``fp32``, ``bf16``) on a device of
    ``kind``: 2 under bf16 autocast, 4 in fp32 (a CPU without native bf16 computes in fp32; ``auto`` does where
    bf16 is not faster)."""
    if requested == "fp32":
        return 4
    if kind == "cpu":
        import torch

        from rlft.models.precision import bf16_pays, cpu_has_native_bf16

        if requested == "auto":
            return 2 if bf16_pays(torch.device("cpu")) else 4
        return 2 if cpu_has_native_bf16() else 4
    return 2
