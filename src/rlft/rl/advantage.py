"""From rewards to advantages: KL placed in the reward (if so configured), then the named estimator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlft.algorithms import AdvantageInputs, adaptive_kl_coef, compute_advantages, kl_penalty, masked_mean
from rlft.rl.batch import UpdateBatch


@dataclass(frozen=True)
class AdvantageStage:
    """estimator: a name in ``ADVANTAGES``; params: the pool its hyper-parameters are taken from."""

    estimator: str
    group_size: int
    kl_estimator: str
    kl_in_reward: bool
    params: dict[str, Any] = field(default_factory=dict)
    reduce: Callable | None = None  # combines the processes' partial statistics (AdvantageInputs.reduce)

    def apply(self, rewards, batch: UpdateBatch, kl_coef: float, valid=None) -> dict[str, float]:
        """Set ``batch.advantages`` (and ``batch.returns``) from rewards [N]; returns statistics.
        valid: [N] bool, False on rows left out of every advantage statistic (advantage 0), or None."""
        stats: dict[str, float] = {}
        token_rewards = None
        if self.kl_in_reward and batch.ref_logprobs is not None:
            assert batch.old_logprobs is not None, "a reference forward comes with the policy's own log-probs"
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, self.kl_estimator) * batch.loss_mask
            token_rewards = -kl_coef * kl
            stats["kl"] = self._batch_mean(kl, batch.loss_mask)
        device = batch.loss_mask.device
        inputs = AdvantageInputs(
            rewards.to(device),
            batch.loss_mask,
            self.group_size,
            token_rewards,
            batch.old_values,
            self.reduce,
            None if valid is None else valid.to(device),
        )
        out = compute_advantages(self.estimator, inputs, **self.params)
        batch.advantages, batch.returns = out.advantages, out.returns
        stats["advantage/abs_mean"] = self._batch_mean(out.advantages.abs(), batch.loss_mask)
        return stats

    def _batch_mean(self, values, mask) -> float:
        """The mean of ``values`` [N, T] over the loss tokens of the whole batch (all processes')."""
        if self.reduce is None:
            return float(masked_mean(values, mask))
        m = mask.double()
        total, count = self.reduce(torch.stack([(values.double() * m).sum(), m.sum()]), "sum").tolist()
        return total / max(count, 1.0)


@dataclass
class KLController:
    """The one owner of the KL coefficient: fixed, or adapted toward ``target`` between steps when set.

    The trainer reads ``coef`` once per step and passes it to every stage that needs it."""

    coef: float
    target: float | None = None
    horizon: int = 10000

    def observe(self, observed_kl: float | None, n_samples: int) -> float:
        """Update after a step that saw ``observed_kl`` (mean per-token) on ``n_samples`` completions."""
        if self.target is not None and observed_kl is not None:
            self.coef = adaptive_kl_coef(
                self.coef, observed_kl, target=self.target, horizon=self.horizon, n_steps=n_samples
            )
        return self.coef
