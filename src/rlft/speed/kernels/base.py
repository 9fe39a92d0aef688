"""What every kernel family shares: the loaded library, the threads its calls run on, and the checks
every call makes before it hands raw memory to C."""

from __future__ import annotations

import ctypes

import torch

DTYPES = {torch.bfloat16: 1, torch.float32: 0}  # the C side's dtype codes


def thin_shape(rows: int, cols: int) -> bool:
    return rows % 16 == 0 and cols % 2 == 0


def check_rows(x: torch.Tensor, weight: torch.Tensor, *like_x: torch.Tensor) -> None:
    """x [rows, dim], weight [dim], and every other tensor x's shape."""
    if x.dim() != 2 or weight.shape != (x.shape[1],) or any(t.shape != x.shape for t in like_x):
        raise ValueError(
            f"norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, others {[tuple(t.shape) for t in like_x]}"
        )


def check(*pairs) -> None:
    """(tensor, dtype or None) pairs: each a contiguous CPU tensor of that dtype (None: bf16 or fp32)."""
    for t, dtype in zip(pairs[::2], pairs[1::2]):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"native kernels take contiguous CPU tensors, got {t.device} {tuple(t.stride())}")
        if t.dtype != (dtype or t.dtype) or (dtype is None and t.dtype not in DTYPES):
            raise ValueError(f"native kernels: expected {dtype or 'bf16 or fp32'}, got {t.dtype}")


class NativeLibrary:
    """The loaded C library (``_lib``) and the threads its calls run on; the kernel families
    (:class:`~rlft.speed.kernels.layers.DecodeKernels`, :class:`~rlft.speed.kernels.update.UpdateKernels`)
    add their methods, and :class:`~rlft.speed.kernels.CpuKernels` loads it."""

    _lib: ctypes.CDLL
    threads_shared: bool  # one OpenMP runtime in the process: the kernels take PyTorch's thread count

    def _threads(self) -> int:
        return torch.get_num_threads() if self.threads_shared else 1
