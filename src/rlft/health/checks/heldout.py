"""Is a rising training reward a better model? Held-out accuracy falling while the reward rises.

An accuracy on N prompts is a binomial estimate: on 50 prompts its standard error near 50 % is 7
points, so one eval 16 points below the best is within noise (the difference of two such estimates
has a standard error of ~10 points). A drop counts only beyond ``accuracy_z`` standard errors of that
difference (and at least ``accuracy_drop``), while the training reward rose by ``reward_rise``: one
such eval is a warning, ``accuracy_evals`` in a row make the run unhealthy.

Two causes look alike in those numbers, and the evaluation's own rewards tell them apart:

- reward hacking: on the held-out prompts another reward (a format bonus, a reward model) rose while
  the accuracy fell, so the policy learnt to please that reward instead of solving the task;
- a held-out regression: no other reward rose there (the held-out reward fell with the accuracy), so
  the policy got worse on prompts it does not train on: an update too large, or over-fitting.

When the accuracy is back within the noise band of its best, the finding is marked recovered: a dip
the run came back from does not leave it with a warning.

A run can also end below its own best without the reward rising -- the policy got worse on the training
prompts too, or drifted on the held-out ones -- and then its last checkpoint is not its best model
(``ended_below_best``, judged once, when the run ends). And a run whose second half added nothing beyond
noise, under ``solved``, has stalled: more of the same steps will not help (``stalled``, judged at the end).

The other way a run's accuracy can mislead is by rising: a run that ends while its held-out accuracy is
still climbing beyond noise, short of solved, stopped before it finished learning, and its final number
understates what the recipe does with more steps (``still_rising``, judged once, when the run ends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlft.health.checks.base import Check, register
from rlft.health.findings import Finding

REGRESSION_KNOB = (
    "algorithm.learning_rate, algorithm.kl_coef (smaller updates, a closer reference); "
    "eval.max_samples (more eval prompts narrow the noise band)"
)


@dataclass
class _Best:
    accuracy: float
    step: int
    num_prompts: int | None
    reward: float | None  # the training reward then (None: before the first step)
    rewards: dict | None  # each reward's mean over that evaluation's completions, where known


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
        self.fallen = False  # a fall was reported and the accuracy has not come back since

    def on_eval(self, step, accuracy, num_prompts, stream, rewards=None) -> Finding | None:
        t = self.t
        reward = stream.recent("reward/mean")
        best = self.best
        band = 0.0 if best is None else noise_band(best.accuracy, best.num_prompts, accuracy, num_prompts, t.accuracy_z)
        back = best is not None and best.accuracy - accuracy <= max(t.accuracy_drop, band)
        if self.fallen and back:
            self.fallen, self.falls = False, 0
            if accuracy > best.accuracy:
                self.best = _Best(accuracy, step, num_prompts, reward, rewards)
            where = "above" if accuracy > best.accuracy else "within the noise band of"
            return self.recovered(
                step,
                f"held-out accuracy is back to {accuracy:.1%}, {where} its best before the fall "
                f"({best.accuracy:.1%} at step {best.step})",
            )
        if best is None or accuracy > best.accuracy:
            self.best, self.falls = _Best(accuracy, step, num_prompts, reward, rewards), 0
            return None
        reward_then = best.reward if best.reward is not None else stream.start("reward/mean")
        rose = reward is not None and reward_then is not None and reward > reward_then + t.reward_rise
        if back or not rose:
            self.falls = 0
            return None
        self.falls += 1
        self.fallen = True
        where = f"{num_prompts} prompts, noise band ±{band:.1%}" if band else "eval size unknown"
        fell = (
            f"held-out accuracy fell to {accuracy:.1%} (best {best.accuracy:.1%} at step {best.step}; {where}) in "
            f"{self.falls} evaluation(s) in a row while the training reward rose from {reward_then:.3f} to "
            f"{reward:.3f}"
        )
        why, knob = self._cause(best.rewards, rewards)
        return self.found(
            step,
            f"{fell}: {why}",
            severity="unhealthy" if self.falls >= t.accuracy_evals else "warning",
            knob=knob,
        )

    def _cause(self, then: dict | None, now: dict | None) -> tuple[str, str]:
        """What the held-out rewards say of a fall: (the message's reason, the knob)."""
        if then is None or now is None or self.task_reward is None:
            return "the policy may be learning to please the reward, not the task (reward hacking)", self.knob
        others = {
            k: (then[k], now[k])
            for k in sorted(set(then) & set(now))
            if k != self.task_reward and then[k] is not None and now[k] is not None
        }
        risen = {k: v for k, v in others.items() if v[1] > v[0] + self.t.reward_rise}
        if risen:
            shown = ", ".join(f"{k} {a:.3f} -> {b:.3f}" for k, (a, b) in risen.items())
            return (
                f"on the same held-out prompts {shown}: the policy is learning to please "
                f"{'that reward' if len(risen) == 1 else 'those rewards'}, not the task (reward hacking)",
                self.knob,
            )
        shown = ", ".join(f"{k} {a:.3f} -> {b:.3f}" for k, (a, b) in others.items())
        return (
            "no other reward rose on the held-out prompts"
            + (f" ({shown})" if shown else "")
            + ", so this is not reward hacking: the policy got worse on prompts it does not train on "
            "(updates too large, or over-fitting the training prompts)",
            REGRESSION_KNOB,
        )


class _JudgedAtTheEnd(Check):
    """A check on the run's whole record of evaluations, judged once, when the run ends."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.evals: list[tuple[int, float, int | None]] = []  # (step, accuracy, prompts), in order

    def on_eval(self, step, accuracy, num_prompts, stream, rewards=None) -> Finding | None:
        self.evals.append((step, accuracy, num_prompts))
        return None


@register
class StillRising(_JudgedAtTheEnd):
    name = "still_rising"
    knob = "train.epochs, train.max_steps (more steps)"
    metrics = ("accuracy",)

    def on_end(self, step: int, stream) -> Finding | None:
        """The last evaluation against the best one at least ``rising_steps`` before it."""
        t = self.t
        if not self.evals:
            return None
        last_step, last, n = self.evals[-1]
        earlier = [e for e in self.evals if e[0] <= last_step - t.rising_steps]
        if not earlier or last >= t.solved:
            return None
        best_step, best, n_best = max(earlier, key=lambda e: (e[1], e[0]))
        band = noise_band(best, n_best, last, n, t.accuracy_z)
        if last - best <= max(t.accuracy_drop, band):
            return None
        where = f"{n} prompts, noise band ±{band:.1%}" if band else "eval size unknown"
        return self.found(
            last_step,
            f"held-out accuracy was still rising when the run ended: {last:.1%} at step {last_step}, up from "
            f"{best:.1%} (the best up to step {best_step}; {where}), and under {t.solved:.0%}: the run stopped "
            "before it finished learning, and more steps would likely raise it",
        )


@register
class EndedBelowBest(_JudgedAtTheEnd):
    name = "ended_below_best"
    knob = (
        "train.save_best (keep the best evaluation's model), algorithm.learning_rate (lower), "
        "eval.max_samples (more eval prompts narrow the noise band)"
    )
    metrics = ("accuracy",)

    def on_end(self, step: int, stream) -> Finding | None:
        """The last evaluation against the best before it, beyond the noise band of the two."""
        if len(self.evals) < 2:
            return None
        last_step, last, n = self.evals[-1]
        best_step, best, n_best = max(self.evals[:-1], key=lambda e: (e[1], -e[0]))
        band = noise_band(best, n_best, last, n, self.t.accuracy_z)
        if best - last <= max(self.t.accuracy_drop, band):
            return None
        where = f"{n} prompts, noise band ±{band:.1%}" if band else "eval size unknown"
        return self.found(
            last_step,
            f"the run ended at {last:.1%} held-out accuracy, below its best of {best:.1%} at step {best_step} "
            f"({where}): its last checkpoint is not its best model, and the steps since made the policy worse",
        )


STALL_EVALS = 3  # evaluations in a run's second half that must all stay within noise of its first half's best


@register
class Stalled(_JudgedAtTheEnd):
    """The mirror of ``still_rising``: the second half of the run added nothing measurable."""

    name = "stalled"
    knob = (
        "algorithm.learning_rate, algorithm.temperature, reward.functions (a shaping reward that pays a wrong "
        "answer), algorithm.tied_group_weight (grpo, dr_grpo)"
    )
    metrics = ("accuracy", "groups_zero_std")

    def on_end(self, step: int, stream) -> Finding | None:
        """The best evaluation of the run's second half against the best of its first, under ``solved``."""
        if not self.evals:
            return None
        last_step, last, n = self.evals[-1]
        half = last_step / 2
        first = [e for e in self.evals if e[0] <= half]
        second = [e for e in self.evals if e[0] > half]
        if not first or len(second) < STALL_EVALS or last >= self.t.solved:
            return None  # with fewer evaluations after the half, no rise beyond noise is too weak a sign
        since, before, n_before = max(first, key=lambda e: (e[1], -e[0]))
        _, after, n_after = max(second, key=lambda e: e[1])
        band = noise_band(before, n_before, after, n_after, self.t.accuracy_z)
        if after - before > max(self.t.accuracy_drop, band):
            return None
        where = f"{n} prompts, noise band ±{band:.1%}" if band else "eval size unknown"
        return self.found(
            last_step,
            f"held-out accuracy stalled at {last:.1%}: in the second half of the run (after step {half:g}) it "
            f"reached at most {after:.1%}, no more than its {before:.1%} at step {since} ({where}), and under "
            f"{self.t.solved:.0%}: more steps at these settings are unlikely to raise it",
        )
