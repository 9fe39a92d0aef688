"""Critic maths for PPO: the value loss and how well the critic explains the returns."""

from __future__ import annotations

import torch

from rlft.algorithms.aggregation import masked_mean
from rlft.algorithms.registry import Registry

VALUE_LOSSES: Registry = Registry("value loss")


@VALUE_LOSSES.register("clipped_mse")
def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       *, value_clip: float = 0.2) -> torch.Tensor:
    """PPO's clipped value loss (as in OpenAI baselines' ppo2), per token [B, T].

    loss_t = 0.5 * max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - R_t)^2):
    the critic is not rewarded for moving further than ``value_clip`` from the values it had when
    the batch was sampled.  values (with grad), old_values, returns: [B, T].
    """
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    return 0.5 * torch.maximum((values - returns).square(), (clipped - returns).square())


@VALUE_LOSSES.register("mse")
def mse_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """0.5 * (V_t - R_t)^2 per token [B, T]."""
    return 0.5 * (values - returns).square()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over loss tokens: 1 is a perfect critic, 0 no better than a constant,
    negative worse than one.  values, returns, mask: [B, T]. NaN when the returns do not vary."""
    mask = mask.float()
    var_r = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    diff = returns - values
    var_d = masked_mean((diff - masked_mean(diff, mask)).square(), mask)
    # Relative test: the variance of constant returns is rounding residue (1e-17 for 0.1), not 0.
    if var_r.item() <= 1e-10 * max(masked_mean(returns.square(), mask).item(), 1e-30):
        return float("nan")
    return float(1.0 - var_d / var_r)
