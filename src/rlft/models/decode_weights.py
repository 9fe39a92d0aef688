"""A bf16 copy of the policy's matmul weights for decoding, refreshed only when they change.

Decoding one token streams every weight of the model from memory, and that is all its speed
depends on. Under bf16 autocast the fp32 master weights are cast on every call: each decode step
reads the fp32 weight (4 bytes a parameter), writes a bf16 copy (2) and reads it back (2) before
any arithmetic, so autocast makes decoding slower than plain fp32 instead of faster. The copy keeps
every ``nn.Linear`` weight already in bf16 (2 bytes a parameter per token) and everything else
(embeddings, norms) as it is; run under the same autocast, it computes exactly what the policy
computes, because autocast would have rounded those weights to the same bf16 values.

A tensor is copied again only when it changed: an optimizer step over it (seen through
PyTorch's global optimizer step hook, because fused optimizer kernels write parameters without
moving their version counters) or any other in-place write such as ``load_state_dict`` (its
version counter moved). So with LoRA only the adapter weights are refreshed, and evaluation batches
between two steps copy nothing.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook


class DecodeWeights:
    """``current()`` is ``source`` as of now with its Linear weights in ``dtype``: frozen, in eval mode."""

    def __init__(self, source: nn.Module, dtype: torch.dtype):
        from rlft.models.fused_decode import fuse_projections, unsupported_reason

        self.module = frozen_copy(source, linear_dtype=dtype)
        if unsupported_reason(self.module) is None:
            fuse_projections(self.module)  # q/k/v and gate/up as one matmul each in the fused decode
        copies = dict(self.module.named_parameters(remove_duplicate=False))
        copies.update(self.module.named_buffers(remove_duplicate=False))
        originals = dict(source.named_parameters(remove_duplicate=False))
        originals.update(source.named_buffers(remove_duplicate=False))
        # A tied weight (embeddings = LM head) is one source tensor with two copies: fp32 and bf16.
        self._pairs = [(originals[k], d) for k, d in copies.items() if d.is_floating_point()]
        self._versions = [s._version for s, _ in self._pairs]
        self._stale = [False] * len(self._pairs)
        self._index: dict[int, list[int]] = {}
        for i, (src, _) in enumerate(self._pairs):
            self._index.setdefault(id(src), []).append(i)
        self.dtype = dtype
        ref = weakref.ref(self)

        def stepped(optimizer, args, kwargs) -> None:
            me = ref()
            if me is not None:
                me._mark(p for group in optimizer.param_groups for p in group["params"])

        self._hook = register_optimizer_step_post_hook(stepped)
        weakref.finalize(self, self._hook.remove)

    def _mark(self, params) -> None:
        for p in params:
            for i in self._index.get(id(p), ()):
                self._stale[i] = True

    def current(self) -> nn.Module:
        """The copy, first refreshed from every source tensor that changed since the last call."""
        with torch.no_grad():
            for i, (src, dst) in enumerate(self._pairs):
                if self._stale[i] or src._version != self._versions[i]:
                    dst.copy_(src)
                    self._versions[i], self._stale[i] = src._version, False
        return self.module


def frozen_copy(source: nn.Module, linear_dtype: torch.dtype | None = None) -> nn.Module:
    """A deep copy of ``source`` without gradients, frozen, in eval mode; with ``linear_dtype`` every
    ``nn.Linear`` weight and bias is stored in that dtype (a Linear tied to an embedding gets its own
    tensor, so the embedding keeps its precision)."""
    grads = {p: p.grad for p in source.parameters()}
    for p in grads:
        p.grad = None  # don't deep-copy gradients
    try:
        module = copy.deepcopy(source)
    finally:
        for p, g in grads.items():
            p.grad = g
    module.requires_grad_(False).eval()
    if linear_dtype is not None:
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                layer.weight = nn.Parameter(layer.weight.detach().to(linear_dtype), requires_grad=False)
                if layer.bias is not None:
                    layer.bias = nn.Parameter(layer.bias.detach().to(linear_dtype), requires_grad=False)
    return module
