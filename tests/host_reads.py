"""Operations that make the host wait for a CUDA GPU, found on any device by a dispatch mode.

A value read on the host (``.item()``, ``bool()``), or an output sized by data (``nonzero``, a boolean index),
makes the host wait for the GPU to finish everything queued before it: the GPU then idles while the host launches
what follows. Inside a CUDA graph's capture such an operation is an error. The tests count them on the CPU,
where the same operations dispatch."""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = {
    "aten._local_scalar_dense.default",  # .item(), int(), float() of a tensor
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.is_nonzero.default",  # bool() of a tensor
    "aten.equal.default",
    "aten._unique2.default",
    "aten.unique_consecutive.default",
}


def reads_on_host(func, args, kwargs) -> bool:
    """Whether the ATen operation ``func`` on ``args``/``kwargs`` waits for the device."""
    name = str(func)
    if name in HOST_READS:
        return True
    if name.startswith("aten.index.Tensor"):  # a boolean mask as an index is a nonzero
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in pytree.tree_leaves(args[1:]))
    # repeat_interleave by a tensor of counts sizes its output from them, unless told the size
    return name.startswith("aten.repeat_interleave.Tensor") and (kwargs or {}).get("output_size") is None


class HostReads(TorchDispatchMode):
    """Every operation inside it that waits for the device, by name, in order (``found``)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if reads_on_host(func, args, kwargs):
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))
