"""Per-token estimators of KL(policy || reference) from sampled tokens.

With log-ratio r = log pi_ref(x) - log pi(x) for x ~ pi (Schulman, "Approximating
KL divergence", 2020):
  k1 = -r               unbiased, high variance, can be negative
  k2 = r^2 / 2          biased, low variance, always >= 0
  k3 = exp(r) - r - 1   unbiased, low variance, always >= 0 (GRPO's choice)
"""

from __future__ import annotations

import torch

from rlft.algorithms.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")

# exp() of a large log-ratio overflows; the clamp keeps k3 finite when a token
# the policy now favours had near-zero reference probability.
_LOG_RATIO_CLAMP = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """logprobs, ref_logprobs: [B, T] -> [B, T]."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """logprobs, ref_logprobs: [B, T] -> [B, T]."""
    return 0.5 * (logprobs - ref_logprobs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """logprobs, ref_logprobs: [B, T] -> [B, T]."""
    log_ratio = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    # expm1 keeps precision for tiny ratios; the floor at 0 removes the last rounding error
    # (float32 gave -6e-8 for r = 6e-8), since a negative KL would reward drifting away.
    return (torch.expm1(log_ratio) - log_ratio).clamp_min(0.0)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate [B, T] with the named estimator."""
    return KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)


def adaptive_kl_coef(coef: float, observed_kl: float, *, target: float, horizon: int, n_steps: int = 1) -> float:
    """One update of the adaptive KL controller (Ziegler et al. 2019, sec. 2.2).

    e = clip(observed / target - 1, -0.2, 0.2);  coef <- coef * (1 + e * n_steps / horizon).
    The coefficient grows while the policy drifts further from the reference than ``target`` and
    shrinks while it stays closer.  Departure: ``observed_kl`` is the mean per-token KL (the paper
    uses the per-sequence sum), so ``target`` is per token and independent of completion length.
    """
    error = max(-0.2, min(0.2, observed_kl / target - 1.0))
    return coef * (1.0 + error * n_steps / horizon)
