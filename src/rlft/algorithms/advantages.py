"""Advantage estimators: rewards (and later values) -> per-token advantages.

Each estimator takes an :class:`AdvantageInputs` bundle plus keyword
hyper-parameters and returns advantages of shape [N, T] (zero on padding), so
sequence-level estimators (GRPO) and token-level ones (GAE) share one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.algorithms.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may use.

    rewards: [N] one scalar reward per completion; completions of the same
        prompt are contiguous, ``group_size`` of them per prompt.
    mask: [N, T] 1 on completion tokens that count in the loss.
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    group_size: int


def group_normalize(rewards: torch.Tensor, group_size: int, *, scale: bool, eps: float = 1e-4) -> torch.Tensor:
    """Centre each group's rewards on the group mean and optionally divide by the group std.

    rewards: [N] with N divisible by group_size -> [N]. The std is the unbiased
    one (as in the GRPO paper's reference code); a group of one gets advantage 0.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


@ADVANTAGES.register("grpo")
def grpo_advantages(inputs: AdvantageInputs, *, scale_rewards: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, sec. 4.1.2), broadcast to every token.

    Departures from the paper: the std gets ``eps`` added (not only guarded
    against zero) so an all-equal group yields exactly 0 rather than NaN, and
    ``scale_rewards=False`` gives the mean-only baseline of Dr. GRPO.

    Returns [N, T].
    """
    seq_adv = group_normalize(inputs.rewards, inputs.group_size, scale=scale_rewards, eps=eps)
    return seq_adv.unsqueeze(-1) * inputs.mask.to(seq_adv.dtype)


def compute_advantages(name: str, inputs: AdvantageInputs, **params) -> torch.Tensor:
    """Run the named estimator; ``params`` are its keyword hyper-parameters."""
    return ADVANTAGES.get(name)(inputs, **params)
