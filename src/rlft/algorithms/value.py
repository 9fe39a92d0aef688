"""Critic maths for PPO: the value loss and how well the critic explains the returns."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlft.algorithms.registry import Registry

VALUE_LOSSES: Registry = Registry("value loss")


@VALUE_LOSSES.register("clipped_mse")
def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *, value_clip: float = 0.2
) -> torch.Tensor:
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


def explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
) -> float:
    """1 - Var(R - V) / Var(R) over loss tokens: 1 is a perfect critic, 0 no better than a constant,
    negative worse than one.  values, returns, mask: [B, T]. NaN when the returns do not vary.

    Moments in float64; ``reduce(tensor, "sum")`` combines them over the processes that hold parts
    of the batch (as for :func:`rlft.algorithms.advantages.whiten`), None: this is the whole batch."""
    combine = reduce or (lambda t, op: t)
    m, r = mask.double(), returns.double()
    d = r - values.double()
    sums = combine(torch.stack([(r * m).sum(), (d * m).sum(), m.sum(), (r.square() * m).sum()]), "sum")
    n = max(float(sums[2]), 1.0)
    mean_r, mean_d = float(sums[0]) / n, float(sums[1]) / n
    var_r, var_d = (
        combine(torch.stack([((r - mean_r).square() * m).sum(), ((d - mean_d).square() * m).sum()]), "sum") / n
    ).tolist()
    # Relative test: the variance of constant returns is rounding residue (1e-17 for 0.1), not 0.
    if var_r <= 1e-10 * max(float(sums[3]) / n, 1e-30):
        return float("nan")
    return 1.0 - var_d / var_r
