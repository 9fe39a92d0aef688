"""Is a rising training reward a better model? Held-out accuracy falling while the reward rises.

An accuracy on N prompts is a binomial estimate: on 50 prompts its standard error near 50 % is 7
points, so one eval 16 points below the best is within noise (the difference of two such estimates
has a standard error of ~10 points). A drop counts only beyond ``accuracy_z`` standard errors of that
difference (and at least ``accuracy_drop``), while the training reward rose by ``reward_rise``: one
such eval is a warning, ``accuracy_evals`` in a row make the run unhealthy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlft.health.checks.base import Check, register
from rlft.health.findings import Finding


@dataclass
class _Best:
    accuracy: float
    step: int
    num_prompts: int | None
    reward: float | None  # the training reward then (None: before the first step)


def noise_band(best: float, n_best: int | None, now: float, n_now: int | None, z: float) -> float:
    """``z`` standard errors of the difference of two binomial accuracies (0 when a size is unknown)."""
    if not n_best or not n_now:
        return 0.0
    return z * math.sqrt(best * (1 - best) / n_best + now * (1 - now) / n_now)


@register
class AccuracyFalls(Check):
    name = "accuracy_falls"
    knob = (
        "reward.functions (a reward the policy can satisfy without solving the task), algorithm.kl_coef; "
        "eval.max_samples (more eval prompts narrow the noise band)"
    )
    metrics = ("accuracy", "reward/mean")

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.best: _Best | None = None
        self.falls = 0  # evaluations in a row beyond the noise band

    def on_eval(self, step, accuracy, num_prompts, stream) -> Finding | None:
        t = self.t
        reward = stream.recent("reward/mean")
        if self.best is None or accuracy > self.best.accuracy:
            self.best, self.falls = _Best(accuracy, step, num_prompts, reward), 0
            return None
        best = self.best
        reward_then = best.reward if best.reward is not None else stream.start("reward/mean")
        band = noise_band(best.accuracy, best.num_prompts, accuracy, num_prompts, t.accuracy_z)
        drop = best.accuracy - accuracy
        rose = reward is not None and reward_then is not None and reward > reward_then + t.reward_rise
        if not (drop > max(t.accuracy_drop, band) and rose):
            self.falls = 0
            return None
        self.falls += 1
        severity = "unhealthy" if self.falls >= t.accuracy_evals else "warning"
        where = f"{num_prompts} prompts, noise band ±{band:.1%}" if band else "eval size unknown"
        return self.found(
            step,
            f"held-out accuracy fell to {accuracy:.1%} (best {best.accuracy:.1%} at step "
            f"{best.step}; {where}) in {self.falls} evaluation(s) in a row while the training reward "
            f"rose from {reward_then:.3f} to {reward:.3f}: the policy may be learning to please the "
            f"reward, not the task (reward hacking)",
            severity=severity,
        )
