"""Policy-gradient losses on per-token log-probabilities.

A loss returns per-token values [B, T] (to be reduced by
``aggregation.aggregate``) plus per-token indicator tensors for statistics; it
never reduces, so the trainer can add a KL term and choose the aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.algorithms.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")


@dataclass
class PolicyLossTerms:
    """per_token_loss: [B, T]; ratio: [B, T]; clipped: [B, T] 1.0 where clipping removed the gradient."""

    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> PolicyLossTerms:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated to be minimised.

    logprobs (with grad), old_logprobs, advantages: [B, T].
    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A), r = exp(logprobs - old_logprobs).

    Departure from the paper: separate lower/upper clip ranges (equal by
    default), as DAPO's "clip-higher" needs. When the rollout's log-probs are
    the old log-probs, r == 1 in value and the loss reduces to the on-policy
    policy gradient -A * logprob.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped_obj = clipped_ratio * advantages
    objective = torch.minimum(unclipped, clipped_obj)
    was_clipped = (clipped_obj < unclipped).to(logprobs.dtype)
    return PolicyLossTerms(per_token_loss=-objective, ratio=ratio.detach(), clipped=was_clipped.detach())


def policy_loss(name: str, logprobs, old_logprobs, advantages, **params) -> PolicyLossTerms:
    """Run the named policy loss."""
    return POLICY_LOSSES.get(name)(logprobs, old_logprobs, advantages, **params)
