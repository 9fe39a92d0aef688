"""A bf16 copy of the policy's matmul weights for decoding, refreshed only when they change.

Decoding one token streams every weight of the model from memory, and that is all its speed
depends on. Under bf16 autocast the fp32 master weights are cast on every call: each decode step
reads the fp32 weight (4 bytes a parameter), writes a bf16 copy (2) and reads it back (2) before
any arithmetic, so autocast makes decoding slower than plain fp32 instead of faster. The copy keeps
every ``nn.Linear`` weight already in bf16 (2 bytes a parameter per token) and reads everything
else (embeddings, norms) from the source's own tensors; run under the same autocast, it computes
exactly what the policy computes, because autocast would have rounded those weights to the same
bf16 values. (The fused decode of Llama-family models packs its own bf16 weights instead and needs
no module copy: ``speed/fused_decode.py``; this copy serves the other paths.)

A tensor is copied again only when it changed: an optimizer step over it (seen through
PyTorch's global optimizer step hook, because fused optimizer kernels write parameters without
moving their version counters) or any other in-place write such as ``load_state_dict`` (its
version counter moved). So with LoRA only the adapter weights are refreshed, and evaluation batches
between two steps copy nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rlft.speed.change_watch import ChangeWatch


@dataclass
class _Entry:
    """One tensor of the copy and how to recompute it: ``make()`` from ``sources``."""

    dst: torch.Tensor
    sources: list[torch.Tensor]
    make: Callable[[], torch.Tensor]


class DecodeWeights:
    """``current()`` is ``source`` as of now with its Linear weights in ``dtype``: frozen, in eval mode.

    A LoRA (PEFT) policy gets a plain model with the adapters merged into the bf16 weights (a LoRA
    layer is refreshed as base + its adapters' delta when they stepped), so it decodes as fast as
    a full model, through the fused decode too; a layout it does not merge (DoRA, modules saved
    whole) is copied with its adapters as they are.
    """

    def __init__(self, source: nn.Module, dtype: torch.dtype):
        from rlft.speed.fused_decode import unsupported_reason
        from rlft.speed.packed_matmul import fuse_projections

        lora = _mergeable_lora_layers(source)
        base = frozen_copy(source, dtype)
        self.module = cast_linears(base.merge_and_unload() if lora else base, dtype)
        if unsupported_reason(self.module) is None:
            fuse_projections(self.module)  # q/k/v and gate/up as one matmul each in the fused decode
        self._entries = _entries(source, self.module, lora or {})
        # PEFT merged the adapters into bf16 weights: the first current() merges again at full precision
        self._watch = ChangeWatch([e.sources for e in self._entries], start_changed=bool(lora))
        self._released: list[tuple[torch.UntypedStorage, int, list[int]]] = []  # (storage, size, its entries)

    @property
    def merged_lora(self) -> bool:
        return not hasattr(self.module, "peft_config") and any(len(e.sources) > 1 for e in self._entries)

    def current(self) -> nn.Module:
        """The copy, first refreshed from every source tensor that changed since the last call, and remade
        where :meth:`release` freed it."""
        changed = set(self._watch.changed())
        with torch.no_grad():
            for storage, nbytes, entries in self._released:
                storage.resize_(nbytes)
                changed.update(entries)
            self._released = []
            for i in sorted(changed):
                self._entries[i].dst.copy_(self._entries[i].make())
        return self.module

    def release(self) -> None:
        """Free the copy's tensors that the next optimizer step rewrites (those made from a trained parameter)
        until the next :meth:`current` remakes them: between a rollout and the update, the update gets their
        memory, and the copy does no work it would not have done. The module and its tensors stay as they are,
        their storage resized to nothing (as FSDP frees unsharded parameters); a storage shared with a frozen
        tensor (a fused q/k/v with a frozen k) is kept, as is everything read from the source."""
        if self._released:
            return
        groups: dict[int, tuple[torch.UntypedStorage, list[int]]] = {}
        for i, e in enumerate(self._entries):
            storage = e.dst.untyped_storage()
            groups.setdefault(storage.data_ptr(), (storage, []))[1].append(i)
        trained = [any(t.requires_grad for t in e.sources) for e in self._entries]
        self._released = [
            (storage, storage.nbytes(), entries)
            for storage, entries in groups.values()
            if storage.nbytes() and all(trained[i] for i in entries)
        ]
        for storage, _, _ in self._released:
            storage.resize_(0)


_PEFT_PREFIX = "base_model.model."


def _mergeable_lora_layers(source: nn.Module) -> dict[str, nn.Module] | None:
    """The LoRA layers of a PEFT model by module name, when every adapter is plain LoRA; else None."""
    from rlft.speed.lora_decode import is_peft, is_variant, saves_modules_whole

    if not is_peft(source):
        return None
    layers = {n: m for n, m in source.named_modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")}
    variant = any(is_variant(m) for m in layers.values())
    return layers if layers and not variant and not saves_modules_whole(source) else None


def _entries(source: nn.Module, copy_: nn.Module, lora: dict[str, nn.Module]) -> list[_Entry]:
    """Every floating-point tensor of ``copy_`` with the source tensors it is made from. Names are
    the source's own, or (a merged LoRA copy) the source's without PEFT's prefix and base layer."""
    originals = dict(source.named_parameters(remove_duplicate=False))
    originals.update(source.named_buffers(remove_duplicate=False))
    copies = dict(copy_.named_parameters(remove_duplicate=False))
    copies.update(copy_.named_buffers(remove_duplicate=False))
    prefix = _PEFT_PREFIX if lora else ""
    out = []
    for key, dst in copies.items():
        if not dst.is_floating_point():
            continue
        path, leaf = key.rsplit(".", 1)
        layer = lora.get(prefix + path)
        if layer is not None and leaf == "weight":
            out.append(
                _Entry(
                    dst, [layer.base_layer.weight, *_adapter_params(layer)], lambda layer=layer: _merged_weight(layer)
                )
            )
            continue
        # A tied weight (embeddings = LM head) is one source tensor with two copies: fp32 and bf16.
        src = originals[prefix + (f"{path}.base_layer.{leaf}" if layer is not None else key)]
        if _shareable(copy_.get_submodule(path), dst, src):
            dst.data = src.detach()  # the copy reads the source's own tensor: nothing to refresh
            continue
        out.append(_Entry(dst, [src], lambda src=src: src))
    return out


def _shareable(owner: nn.Module, dst: torch.Tensor, src: torch.Tensor) -> bool:
    """A tensor the copy keeps in the source's dtype is the source's tensor itself: embeddings and norms (an
    fp32 embedding matrix is 113 MB on SmolLM2), and a frozen Linear weight already stored in the copy's dtype,
    as a LoRA base's LM head is (1 GB at Llama-3-8B), unless the copy made it a view of a fused q/k/v or gate/up."""
    if dst.dtype != src.dtype or dst.shape != src.shape:
        return False
    if not isinstance(owner, nn.Linear):
        return True
    return not src.requires_grad and dst.untyped_storage().nbytes() == dst.numel() * dst.element_size()


def _adapter_params(layer: nn.Module) -> list[torch.Tensor]:
    return [p for a in layer.active_adapters for d in (layer.lora_A, layer.lora_B) if a in d for p in d[a].parameters()]


def _merged_weight(layer: nn.Module) -> torch.Tensor:
    weight = layer.base_layer.weight
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            weight = weight + layer.get_delta_weight(adapter)
    return weight


def frozen_copy(source: nn.Module, linear_dtype: torch.dtype | None = None) -> nn.Module:
    """A deep copy of ``source`` without gradients, frozen, in eval mode; with ``linear_dtype`` its
    Linear weights are stored in that dtype (:func:`cast_linears`), copied straight into it: a copy
    at full precision first would briefly hold another fp32 model (32 GB for an 8B LoRA policy's base,
    more than the whole update needs)."""
    grads = {p: p.grad for p in source.parameters()}
    for p in grads:
        p.grad = None  # don't deep-copy gradients
    try:
        module = copy.deepcopy(source, _cast_linears_memo(source, linear_dtype) if linear_dtype else None)
    finally:
        for p, g in grads.items():
            p.grad = g
    module.requires_grad_(False).eval()
    return cast_linears(module, linear_dtype) if linear_dtype is not None else module


def linear_only_params(module: nn.Module) -> list[nn.Parameter]:
    """Every Linear's weight and bias that no other kind of module shares (not an LM head tied to the
    embedding): the parameters that may be stored in a matmul dtype without changing anything else."""
    shared = {id(p) for m in module.modules() if not isinstance(m, nn.Linear) for p in m.parameters(recurse=False)}
    found = {
        id(p): p
        for m in module.modules()
        if isinstance(m, nn.Linear)
        for p in (m.weight, m.bias)
        if p is not None and p.is_floating_point() and id(p) not in shared
    }
    return list(found.values())


def _cast_linears_memo(source: nn.Module, dtype: torch.dtype) -> dict[int, nn.Parameter]:
    """A ``copy.deepcopy`` memo that copies each Linear weight and bias as its cast to ``dtype`` (a weight
    another module shares keeps its precision)."""
    return {
        id(p): nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False) for p in linear_only_params(source)
    }


def cast_linears(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Store every ``nn.Linear`` weight and bias of ``module`` in ``dtype`` (a Linear tied to an
    embedding gets its own tensor, so the embedding keeps its precision). Returns ``module``."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            layer.weight = nn.Parameter(layer.weight.detach().to(dtype), requires_grad=False)
            if layer.bias is not None:
                layer.bias = nn.Parameter(layer.bias.detach().to(dtype), requires_grad=False)
    return module
