"""Recomputing activations in the backward: every layer's whole forward, or only its cheap part.

A decoder layer's forward keeps, for its backward, far more than its matmuls' outputs. Under bf16
autocast over fp32 master weights (rlft's bf16), Hugging Face's Llama layer keeps per token the fp32
residual stream twice per norm (its input and its normalised copy), one bf16 cast of a norm's output
per projection that reads it (q, k and v each cast it again; gate and up too), the MLP's gate, its
SiLU, up and their product, and the bf16 cast of every weight: 56 (SmolLM2-135M) to 74 (SmolLM2-1.7B)
bytes per hidden unit and token in a layer, plus the casts (``benchmarks/recompute.py``).

Three ways to run the update's layers (``model.gradient_checkpointing``):

* ``off`` keeps all of it;
* ``selective`` keeps each layer's input and the outputs of its large matmuls (q, k, v, o, gate,
  up, down) and of fused attention kernels, and recomputes the rest in the backward: the norms,
  rotary embeddings, SiLU and products, dtype casts (weights included), and on the CPU the attention
  itself. That is 22-30 bytes per hidden unit and token in bf16, under half, and no weight casts kept;
  the recomputed work is elementwise, a few per cent of the layer's FLOPs;
* ``full`` keeps only each layer's input and replays its whole forward (a third more FLOPs).

Selective is PyTorch's own selective activation checkpointing
(:func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`) under the non-reentrant
checkpoint Hugging Face already wraps each layer in; :func:`keeps` is the whole of rlft's part (a compiled
layer's graph is tagged by the same rule: :mod:`rlft.models.compiled`). A
matmul whose inner dimension is small beside its output (a LoRA adapter's up-projection from its rank)
is recomputed rather than kept: its output is as wide as the base layer's and costs r/h of it to redo. Outputs are
cached only for ops that nothing mutates in place afterwards: rlft's native attention softmax writes
over its own score matmul's output, so batched matmuls (``bmm``) are recomputed, never kept.

The numbers are those of the plain forward: the recomputed ops run the same kernels on the same
inputs, and random ops replay the forward's random state.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

Recompute = Literal["off", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("off", "selective", "full")
# the attribute of a decoder layer that runs its own recomputation (a compiled layer, rlft.models.compiled):
# its mode, where Hugging Face's checkpointing is off on it
OWN_MODE = "rlft_recompute"

# a matmul whose inner dimension is under 1/8 of its output's width (a LoRA up-projection: rank -> hidden) is
# cheaper to redo than its output is to keep; a plain projection's is at least 1/8 (GQA's k and v: 1/4 to 1/8)
_CHEAP_RATIO = 8


@functools.cache
def _kept_ops() -> tuple[frozenset, frozenset]:
    """(linear matmuls, fused attention ops) whose outputs selective recomputation keeps."""
    aten = torch.ops.aten
    attention = (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    )
    fused = frozenset(getattr(aten, name).default for name in attention if hasattr(aten, name))
    return frozenset({aten.mm.default, aten.addmm.default}), fused


def keeps(func, *args) -> bool:
    """Whether selective recomputation keeps the output of ``func`` on ``args`` (tensors, or the fake tensors a
    traced graph records): a linear matmul with a wide inner dimension, or a fused attention kernel."""
    matmuls, attention = _kept_ops()
    if func in attention:
        return True
    if func in matmuls:
        left, right = args[:2] if func is torch.ops.aten.mm.default else args[1:3]  # addmm(bias, left, right)
        return left.shape[-1] * _CHEAP_RATIO >= right.shape[-1]
    return False


def _policy(ctx, func, *args, **kwargs):
    """PyTorch's checkpoint policy from :func:`keeps`: ``MUST_SAVE`` what it keeps, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if keeps(func, *args) else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def _checkpoint_kwargs(mode: Recompute) -> dict:
    """PyTorch's checkpoint arguments for ``mode`` (``full`` or ``selective``): non-reentrant, with rlft's policy
    where selective."""
    return {"use_reentrant": False, **({"context_fn": _selective_contexts} if mode == "selective" else {})}


def recompute(fn, mode: Recompute, *args):
    """``fn(*args)`` under a non-reentrant checkpoint that recomputes in the backward as ``mode`` says (not ``off``)."""
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, **_checkpoint_kwargs(mode))


def enable_gradient_checkpointing(model: torch.nn.Module, mode: Recompute = "full") -> None:
    """Recompute activations in the backward (non-reentrant), ``full`` or ``selective`` (see the module);
    ``model`` is a transformers model or a PEFT wrapper of one. Layers that run their own recomputation
    (:data:`OWN_MODE`) take the mode themselves.

    ``config.use_cache`` is switched off so that training forwards do not build a
    KV cache (which checkpointing would refuse anyway); ``generation_config.use_cache``
    stays on so that ``generate`` still decodes with a cache.
    """
    if mode not in ("selective", "full"):
        raise ValueError(f"recompute mode {mode!r}: expected 'selective' or 'full'")
    own = [m for m in model.modules() if OWN_MODE in m.__dict__]
    for m in own:
        setattr(m, OWN_MODE, mode)
    if not own:
        kwargs = _checkpoint_kwargs(mode)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name is deprecated
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.use_cache = True


def configured_mode(setting: bool | str) -> Recompute | None:
    """The mode a ``model.gradient_checkpointing`` setting names (true: ``full``, false: ``off``), or None
    for ``auto``, which the job decides from its memory budget."""
    return None if setting == "auto" else {True: "full", False: "off"}.get(setting, setting)  # type: ignore[return-value]


def recompute_mode(model: torch.nn.Module) -> Recompute:
    """How ``model``'s layers run in a training backward: ``off``, ``selective`` or ``full``, read from
    the layers (they are the one owner of that choice): their own mode where they run their own
    recomputation (:data:`OWN_MODE`), else the checkpointing function Hugging Face gave them."""
    own = next((m.__dict__[OWN_MODE] for m in model.modules() if OWN_MODE in m.__dict__), None)
    if own is not None:
        return own
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            fn = getattr(m, "_gradient_checkpointing_func", None)
            selective = getattr(fn, "keywords", {}).get("context_fn") is _selective_contexts
            return "selective" if selective else "full"
    return "off"


def is_checkpointing(model: torch.nn.Module) -> bool:
    """True when some layer of ``model`` recomputes activations in the backward (selectively or fully)."""
    return recompute_mode(model) != "off"
