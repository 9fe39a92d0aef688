"""Policy-gradient losses on per-token log-probabilities.

A loss returns per-token values [B, T] (to be reduced by
``aggregation.aggregate``) plus per-token tensors for statistics; it never
reduces over the batch, so the trainer can add a KL term and choose the
aggregation.  Every loss has the same data arguments (logprobs with grad,
old_logprobs, advantages, mask: all [B, T]) and keyword-only hyper-parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlft.algorithms.aggregation import masked_mean
from rlft.algorithms.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")

# exp() of a large log-ratio overflows; no sane update moves a token's log-prob this far.
_LOG_RATIO_CLAMP = 20.0


@dataclass
class PolicyLossTerms:
    """per_token_loss: [B, T]; ratio: [B, T] (detached); clipped: [B, T] 1.0 where clipping removed the gradient."""

    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor


def _clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None = None,
) -> PolicyLossTerms:
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    unclipped = ratio * advantages
    clipped_obj = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    objective = torch.minimum(unclipped, clipped_obj)
    was_clipped = clipped_obj < unclipped
    if dual_clip_c is not None:
        floor = dual_clip_c * advantages
        lifted = (advantages < 0) & (objective < floor)
        objective = torch.where(lifted, floor, objective)
        was_clipped = was_clipped | lifted
    return PolicyLossTerms(per_token_loss=-objective, ratio=ratio.detach(), clipped=was_clipped.to(ratio.dtype))


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> PolicyLossTerms:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated to be minimised.

    loss_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t),  r_t = exp(logprobs - old_logprobs).

    Departure from the paper: separate lower/upper clip ranges (DAPO's "clip-higher" raises
    clip_high so low-probability tokens can still gain mass).  When the rollout's log-probs are the
    old log-probs, r == 1 in value and the loss is the on-policy policy gradient -A * logprob.
    """
    return _clipped_surrogate(logprobs - old_logprobs, advantages, clip_low, clip_high)


@POLICY_LOSSES.register("dual_clip")
def dual_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float = 3.0,
) -> PolicyLossTerms:
    """Dual-clip PPO (Ye et al. 2020, "Mastering complex control in MOBA games"), negated.

    As ``ppo_clip``, but for negative advantages the objective is also bounded below by
    ``dual_clip_c * A`` (c > 1), so a token whose ratio has grown huge cannot produce an unbounded
    loss.  Departure: asymmetric clip ranges, as in ``ppo_clip``.
    """
    if dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    return _clipped_surrogate(logprobs - old_logprobs, advantages, clip_low, clip_high, dual_clip_c)


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> PolicyLossTerms:
    """GSPO (Zheng et al. 2025): the importance ratio is per *sequence*, the length-normalised
    s_i = exp(mean_t(logprobs - old_logprobs)), and whole sequences are clipped.

    Implemented in the paper's token form s_i,t = sg[s_i] * pi_t / sg[pi_t]: equal to s_i in value,
    with gradient s_i * grad log pi_t, so with ``seq_mean_token_mean`` aggregation it is the
    sequence objective exactly, and token-level advantages are allowed.  Clip ranges are
    therefore tiny (paper: 3e-4 / 4e-4).  No departure beyond accepting per-token advantages.
    """
    seq_log_ratio = masked_mean(logprobs - old_logprobs, mask, dim=-1).detach()
    log_ratio = seq_log_ratio.unsqueeze(-1) + logprobs - logprobs.detach()
    return _clipped_surrogate(log_ratio, advantages, clip_low, clip_high)


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> PolicyLossTerms:
    """Plain REINFORCE (Williams 1992): loss_t = -A_t * logprob_t, no importance ratio, no clip.

    Correct only on-policy (one optimizer step per rollout); with several steps the later ones use
    stale samples uncorrected.  The ratio is reported for monitoring only.
    """
    ratio = torch.exp((logprobs - old_logprobs).detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return PolicyLossTerms(per_token_loss=-advantages * logprobs, ratio=ratio, clipped=torch.zeros_like(ratio))


def policy_loss(name: str, logprobs, old_logprobs, advantages, mask, /, **pool) -> PolicyLossTerms:
    """Run the named policy loss with the hyper-parameters it declares taken from ``pool``."""
    return POLICY_LOSSES.call(name, logprobs, old_logprobs, advantages, mask, **pool)
