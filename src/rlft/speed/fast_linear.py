"""Decode-shaped linear layers computed as ``W @ x.T``.

During token-by-token decoding every linear layer multiplies a handful of rows
(one per sequence) by a weight read cold from memory, so its speed is set by
how well the GEMM streams the weight.  On x86 CPUs with MKL the ``W @ x.T``
orientation streams it 20-45 % faster than ``x @ W.T`` for up to a few dozen
rows (measured on SmolLM2-135M shapes, see docs/performance.md); the
results are the same up to float summation order.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch

MAX_ROWS = 64  # above this the usual orientation is as fast or faster


def matmul_weight_t(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ weight [N, K].T`` -> [M, N] (maybe not contiguous): weight-first on CPU for up to
    MAX_ROWS rows."""
    if x.device.type == "cpu" and 0 < x.shape[0] <= MAX_ROWS:
        return torch.mm(weight, x.t()).t()
    return x @ weight.t()


def _weight_first_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or rows > MAX_ROWS:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    out = matmul_weight_t(x.reshape(rows, x.shape[-1]), self.weight).contiguous()
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.weight.shape[0])


@contextlib.contextmanager
def weight_first_linears(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, plain ``nn.Linear`` layers of ``model`` (including the LM head and the
    base layers under LoRA adapters) use the weight-first product for small inputs.

    Only the instance ``forward`` is replaced, so module hooks still run; it is restored on exit.
    Applies to CPU models only: the gain was measured on MKL, and on GPUs decode is bound by kernel
    launches, where the extra transpose copy would cost more than it saves.
    """
    patched = []
    param = next(model.parameters(), None)
    on_cpu = param is not None and param.device.type == "cpu"
    for module in model.modules() if on_cpu else ():
        if type(module) is torch.nn.Linear and "forward" not in module.__dict__:
            module.forward = types.MethodType(_weight_first_forward, module)
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward
