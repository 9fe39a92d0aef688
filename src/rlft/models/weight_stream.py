"""The policy's weights as a plain Hugging Face checkpoint would name them, for pushing into another engine.

An inference engine that holds its own copy of the weights (vLLM) loads ``(name, tensor)`` pairs under
the names of the model's ``model.safetensors``. A full model's ``state_dict`` already is that. A LoRA
(PEFT) policy's is not: its names carry PEFT's ``base_model.model.`` prefix and ``base_layer``, and the
adapters are separate tensors. :func:`checkpoint_weights` merges each adapter into its layer's weight
(W + scale * B @ A, what ``merge_and_unload`` would write) one layer at a time, so the engine sees one
plain model and no merged copy of the whole model is ever held.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


class UnmergeableAdapter(ValueError):
    """The PEFT model has adapter parts that are not plain LoRA on a weight (DoRA, modules saved whole)."""


def checkpoint_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor of ``model``'s state dict under its plain checkpoint name,
    detached, in the model's own dtype and device, with LoRA adapters merged into their weights.

    A tied weight (the LM head sharing the embeddings) appears under both names, as in
    ``state_dict``. Raises :class:`UnmergeableAdapter` for adapters it cannot merge."""
    if not hasattr(model, "peft_config"):
        for name, tensor in model.state_dict().items():
            yield name, tensor.detach()
        return
    base = model.get_base_model()
    layers = lora_layers(base)
    with torch.no_grad():
        for key, tensor in base.state_dict().items():
            if ".lora_" in key:
                continue  # the adapter's A and B: merged into the layer's weight below
            if ".modules_to_save." in key or ".original_module." in key:
                raise UnmergeableAdapter(
                    f"{key}: a module saved whole by the adapter cannot be pushed as a merged "
                    f"weight (only plain LoRA layers can)"
                )
            path, _, leaf = key.partition(".base_layer.")
            if not leaf:
                yield key, tensor.detach()
                continue
            layer = layers[path]
            yield f"{path}.{leaf}", (merged_weight(layer) if leaf == "weight" else tensor.detach())


def lora_layers(base: nn.Module) -> dict[str, nn.Module]:
    """PEFT's LoRA layers of ``base`` (the PEFT model's base model) by module name; DoRA is refused."""
    layers = {n: m for n, m in base.named_modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")}
    for name, layer in layers.items():
        if any(getattr(layer, "use_dora", {}).values()):
            raise UnmergeableAdapter(f"{name}: DoRA adapters cannot be pushed as merged weights (only plain LoRA)")
    return layers


def merged_weight(layer: nn.Module) -> torch.Tensor:
    """The weight of one LoRA layer with its active adapters added: base + sum of their deltas (a layer
    PEFT has already merged in place is returned as it is)."""
    weight = layer.base_layer.weight.detach()
    if getattr(layer, "merged", False):
        return weight
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
    return weight
