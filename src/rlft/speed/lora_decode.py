"""A LoRA policy's fused decode without a merged copy: the frozen base read as it is, the adapters as
low-rank products.

A merged decode copy (:mod:`rlft.speed.decode_weights`) decodes at a plain model's speed but holds a
second bf16 copy of every adapted weight while generating: 14 GiB at Llama-3-8B, beside the 16 GB base,
which is what keeps an 8B LoRA run off a 24 GB GPU. On a CPU it is worse: the merged module is packed
again for the decode kernels, and every adapted weight is merged and packed again after each optimizer
step. Here each of the fused decode's matmuls multiplies its frozen base weights (as they are on a GPU,
packed once on a CPU: they never change) and adds the adapters' term, ``x @ A.T @ (s B).T``, with the
group's Linears (q/k/v, gate/up) handled as one: their A matrices stacked, their B matrices (each times
its adapter's scaling) placed block-diagonally, so a fused matmul adds two small products whatever it
fuses. That is also what PEFT's forward computes (``base(x) + lora_B(lora_A(x)) * scaling``), rather than
a base rounded to bf16 after the delta was added.

Supported: plain LoRA on ``nn.Linear`` layers, any number of active adapters. Not: DoRA and the other
LoRA variants, adapters with a bias, modules saved whole, adapted embeddings or LM heads
(:func:`adapter_reason`); those decode from the merged copy or the model's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_OUTSIDE_LAYERS = {"embed_tokens", "lm_head"}  # read by the fused decode as they are


def is_peft(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT wrapper (a LoRA policy)."""
    return hasattr(model, "peft_config")


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (its Linears then PEFT's LoRA layers), or ``model``."""
    return model.get_base_model() if is_peft(model) else model


def base_linear(module: nn.Module) -> nn.Module:
    """The frozen Linear a LoRA layer wraps, or ``module`` itself."""
    return getattr(module, "base_layer", module)


def saves_modules_whole(model: nn.Module) -> bool:
    """Whether a PEFT model trains some modules whole (``modules_to_save``) beside its adapters."""
    return any(".modules_to_save." in n for n, _ in model.named_parameters())


def is_variant(layer: nn.Module) -> bool:
    """Whether a LoRA layer runs a LoRA variant (DoRA or another) rather than plain LoRA."""
    return bool(getattr(layer, "lora_variant", None)) or any(getattr(layer, "use_dora", {}).values())


def adapter_reason(model: nn.Module) -> str | None:
    """None when every adapter of the PEFT ``model`` is one :class:`LowRank` can apply (or ``model`` has
    none), else why not."""
    if not is_peft(model):
        return None
    if saves_modules_whole(model):
        return "LoRA with modules saved whole (modules_to_save)"
    for name, m in model.named_modules():
        if not hasattr(m, "lora_A"):
            continue
        if not isinstance(base_linear(m), nn.Linear) or name.rsplit(".", 1)[-1] in _OUTSIDE_LAYERS:
            return f"a LoRA adapter on {name} (only the decoder layers' Linears are applied unmerged)"
        if is_variant(m):
            return "a LoRA variant (DoRA or another) rather than plain LoRA"
        if getattr(m, "merged", False):
            return "LoRA adapters merged into their base"
        if any(b.bias is not None for b in m.lora_B.values()):
            return "LoRA adapters with a bias (lora_bias)"
    return None


def _factors(linear: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(A [r, K], B [N, r], scaling) of each active adapter of a LoRA layer; [] for a plain Linear."""
    if not hasattr(linear, "lora_A") or getattr(linear, "disable_adapters", False):
        return []
    return [
        (linear.lora_A[a].weight, linear.lora_B[a].weight, float(linear.scaling[a]))
        for a in linear.active_adapters
        if a in linear.lora_A
    ]


@dataclass
class _Block:
    """One adapter of one Linear: where its factors go in the stacked A and the block-diagonal B."""

    a: torch.Tensor  # the adapter's A [r, K] (a trained parameter)
    b: torch.Tensor  # its B [N, r]
    scaling: float
    rows: slice  # its output rows in the group's product (the Linear's place among those fused)
    rank: slice  # its columns of the stacked rank


class LowRank:
    """The adapters' term of one fused matmul: ``x [M, K] -> (x @ A.T) @ B.T [M, N]`` in ``dtype``, with A
    [R, K] every adapter's A stacked and B [N, R] each B times its scaling in its Linear's rows (zeros
    elsewhere). :meth:`refresh` copies the trained factors into the same two tensors, so a CUDA graph
    captured over them replays the current adapters."""

    def __init__(self, blocks: list[_Block], out_features: int, dtype: torch.dtype):
        self.blocks = blocks
        ref = blocks[0].a
        rank = blocks[-1].rank.stop
        self.a = torch.zeros(rank, ref.shape[1], dtype=dtype, device=ref.device)
        self.b = torch.zeros(out_features, rank, dtype=dtype, device=ref.device)
        self.refresh()

    @classmethod
    def of(cls, linears: list[nn.Module], dtype: torch.dtype) -> LowRank | None:
        """The term of ``linears`` (the Linears one matmul fuses, in its output order), or None when none is
        adapted."""
        blocks, row, rank = [], 0, 0
        for linear in linears:
            out = base_linear(linear).out_features
            for a, b, scaling in _factors(linear):
                blocks.append(_Block(a, b, scaling, slice(row, row + out), slice(rank, rank + a.shape[0])))
                rank += a.shape[0]
            row += out
        return cls(blocks, row, dtype) if blocks else None

    def refresh(self) -> None:
        """Copy every adapter's current A and (scaled) B into place: after an optimizer step, before a rollout."""
        with torch.no_grad():
            for blk in self.blocks:
                self.a[blk.rank].copy_(blk.a)
                self.b[blk.rows, blk.rank].copy_(blk.b * blk.scaling)


def add_low_rank(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out + (x @ a.T) @ b.T`` for out [M, N] (a base matmul's output), x [M, K], a [R, K], b [N, R]: the
    adapters' term added, the second product and the sum as one kernel."""
    return torch.addmm(out, x @ a.T, b.T)
