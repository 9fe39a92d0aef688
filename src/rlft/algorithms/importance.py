"""Correcting for the gap between the engine that sampled a rollout and the trainer that scores it.

A fast rollout engine (vLLM's kernels in bf16, a fused decode loop) does not compute exactly the
trainer's log-probs for the same weights, so the tokens were drawn from a slightly different
policy, mu, than the pi_old the PPO ratio is taken against. Truncated importance sampling (TIS;
Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", the
fix verl, OpenRLHF and prime-rl ship) reweights each token's policy-gradient term by

    w_t = min(pi_old(y_t) / mu(y_t), C) = min(exp(old_logprob_t - rollout_logprob_t), C)

detached, so the gradient is (nearly) the on-policy one for pi_old; the cap C bounds the variance a
token mu found unlikely could add.

Pure tensor maths: the trainer passes the two log-prob tensors and the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp() of a log-ratio beyond this overflows float32; the cap clips far below it anyway.
_LOG_RATIO_CLAMP = 20.0


@dataclass
class ImportanceWeights:
    """weights: [B, T] detached min(exp(old - rollout), cap) on the loss tokens and 1 elsewhere (a
    padding position's loss, masked out later, is left as it is); truncated: [B, T] 1.0 on the loss
    tokens whose weight the cap cut (pi_old / mu > cap)."""

    weights: torch.Tensor
    truncated: torch.Tensor


def truncated_importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> ImportanceWeights:
    """Per-token TIS weights min(exp(old_logprobs - rollout_logprobs), cap) on the loss tokens.

    old_logprobs: [B, T] the trainer's log-probs of the sampled tokens under the policy that
    sampled them (pi_old); rollout_logprobs: [B, T] the engine's (mu); mask: [B, T] 1 on loss
    tokens. ``cap`` > 0 (C; 2.0 in the paper's experiments). Identical log-probs give weight 1.
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    mask = mask.to(old_logprobs.dtype)
    log_ratio = (old_logprobs.detach().float() - rollout_logprobs.detach().float()).clamp(
        -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP
    )
    ratio = torch.exp(log_ratio)
    weights = torch.where(mask > 0, ratio.clamp(max=cap), torch.ones_like(ratio)).to(old_logprobs.dtype)
    truncated = (ratio > cap).to(old_logprobs.dtype) * mask
    return ImportanceWeights(weights=weights, truncated=truncated)


def logprob_mismatch(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|old_logprobs - rollout_logprobs| [B, T] on the loss tokens (0 elsewhere), detached: how far the
    engine's sampling log-probs are from the trainer's for the same tokens and weights."""
    return (old_logprobs.detach().float() - rollout_logprobs.detach().float()).abs() * mask.float()
