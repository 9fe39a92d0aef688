"""Choosing the compute dtype: bf16 autocast only where the hardware runs bf16 natively.

On a CPU without AVX-512-BF16 or AMX, PyTorch emulates bf16 matmuls and they
run about 50-100x slower than fp32, so asking for bf16 there would turn a
10-minute run into a day. rlft then computes in fp32 and says so in the log.
"""

from __future__ import annotations

import contextlib
import functools

import torch

_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """True if /proc/cpuinfo lists a bf16 matmul extension (Linux x86); False elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return any(flag in flags for flag in _BF16_CPU_FLAGS)


def native_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def autocast_dtype(requested: str, device: torch.device) -> tuple[torch.dtype | None, str | None]:
    """The autocast dtype for ``model.dtype`` (None = fp32) and a warning if the request was overridden."""
    if requested == "fp32":
        return None, None
    if native_bf16(device):
        return torch.bfloat16, None
    return None, (f"model.dtype is bf16 but this {device.type.upper()} has no native bf16 matmul "
                  f"(no {' / '.join(_BF16_CPU_FLAGS)}); emulated bf16 is far slower than fp32, so this run computes in fp32")


def autocast(dtype: torch.dtype | None, device: torch.device):
    """bf16/fp16 autocast on ``device`` if ``dtype`` is set, else nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
