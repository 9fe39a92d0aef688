"""Hugging Face's RMSNorm as one ``F.rms_norm`` call: on a GPU one fused kernel each way instead of six to ten.

Llama's RMSNorm (and Mistral's, Qwen2's and Qwen3's, the same code) is written as separate operations:
a cast to fp32, the square, the mean, the reciprocal square root, two products and a cast back. In the
update's forward and backward (and again where selective recomputation redoes it) each is a pass over the
whole [tokens, hidden] activation: at SmolLM2-1.7B with 8.6k tokens, 70 MB of fp32 a pass, 49 norms a
forward. PyTorch's ``F.rms_norm`` runs as one fused kernel forward and one backward on CUDA; on the CPU it
is the same operations as Hugging Face's, so there the numbers are bit for bit unchanged
(``tests/speed/test_fused_norm.py``). The rollout's fused decode already normalises with it.

The formula is kept exactly, roundings included: an fp32 input (rlft's residual stream under bf16
autocast) is normalised and scaled in fp32; a reduced-precision input (a bf16 reference copy) is
normalised in fp32, rounded to its dtype, then scaled, as Hugging Face does.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

# the RMSNorm classes whose forward is Llama's, line for line (Gemma's scales by 1 + weight: not here)
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def _forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``weight * (x / rms(x)).to(x.dtype)`` through ``F.rms_norm``: x [..., hidden]."""
    shape, eps = (x.shape[-1],), self.variance_epsilon
    if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
        return F.rms_norm(x, shape, self.weight, eps)  # nothing to round between: the weight goes in too
    return self.weight * F.rms_norm(x.to(torch.float32), shape, None, eps).to(x.dtype)


def fuse_rms_norms(model: nn.Module) -> int:
    """Make each of ``model``'s RMSNorm modules of :data:`RMS_NORMS` normalise with ``F.rms_norm``; returns
    how many. Only the instance's ``forward`` is set (a deep copy, as the reference, keeps it)."""
    fused = 0
    for module in model.modules():
        if type(module).__name__ in RMS_NORMS and "forward" not in module.__dict__:
            module.forward = types.MethodType(_forward, module)
            fused += 1
    return fused
