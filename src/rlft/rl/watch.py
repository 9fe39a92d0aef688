"""Reward-hacking watch: signs that a rising training reward is not a better model.

Flags (each logged once as a warning, and kept in ``flags`` for the eval files):

* held-out accuracy falls while the training reward rises;
* completion length, or the repetition score, keeps growing;
* a reward term other than the task reward (``eval.accuracy_reward``, default the first) carries almost
  all of the reward's variation: shaping, not the task, is steering the update.  (The task reward
  dominating once a format reward saturates is the healthy case and is not flagged.)

Thresholds: ``train.watch`` (:class:`~rlft.config.schema.WatchConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlft.config.schema import WatchConfig


@dataclass
class RewardHackingWatch:
    thresholds: WatchConfig
    log: object
    task_reward: str | None = None
    flags: list[dict] = field(default_factory=list)
    _steps: list[dict] = field(default_factory=list)
    _best_eval: tuple[float, float] | None = None  # (accuracy, training reward at that time)
    _dominant_steps: int = 0

    def observe_step(self, step: int, metrics: dict[str, float]) -> None:
        self._steps.append(metrics)
        t = self.thresholds
        if len(self._steps) >= 2 * t.window:
            self._check_growth(step, "completion_len/mean", "completion length",
                               lambda a, b: b > a * (1 + t.length_growth) and b - a >= 2)
            self._check_growth(step, "repetition/mean", "repetition score", lambda a, b: b - a > t.repetition_growth)
        shares = {k.removeprefix("reward_share/"): v for k, v in metrics.items() if k.startswith("reward_share/")}
        top = max(shares.items(), key=lambda kv: kv[1], default=None)
        dominant = len(shares) > 1 and top[0] != self.task_reward and top[1] >= t.dominance
        self._dominant_steps = self._dominant_steps + 1 if dominant else 0
        if self._dominant_steps >= t.patience:
            self._flag("dominance", step, f"reward '{top[0]}' carried {top[1]:.0%} of the reward variation for "
                       f"{self._dominant_steps} steps, more than the task reward '{self.task_reward}': "
                       f"the update follows it, not the task")

    def observe_eval(self, step: int, accuracy: float, num_prompts: int | None = None) -> None:
        """``num_prompts``: how many prompts the accuracy is over. A drop smaller than two binomial standard
        errors of the best accuracy is sampling noise (on 50 prompts, 18% -> 10% is 4 prompts) and not flagged."""
        t = self.thresholds
        reward = self._recent("reward/mean")
        if reward is None:
            return
        if self._best_eval is None or accuracy > self._best_eval[0]:
            self._best_eval = (accuracy, reward)
            return
        best_acc, reward_then = self._best_eval
        noise = 2 * math.sqrt(best_acc * (1 - best_acc) / num_prompts) if num_prompts else 0.0
        if accuracy < best_acc - max(t.accuracy_drop, noise) and reward > reward_then + t.reward_rise:
            self._flag("accuracy_falls", step, f"held-out accuracy fell to {accuracy:.1%} (best {best_acc:.1%}) while "
                       f"the training reward rose from {reward_then:.3f} to {reward:.3f}: possible reward hacking")

    def _recent(self, key: str, start: bool = False) -> float | None:
        w = self.thresholds.window
        rows = self._steps[:w] if start else self._steps[-w:]
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else None

    def _check_growth(self, step: int, key: str, label: str, grew) -> None:
        first, last = self._recent(key, start=True), self._recent(key)
        if first is not None and last is not None and grew(first, last):
            self._flag(f"growth:{key}", step, f"{label} grew from {first:.2f} (first {self.thresholds.window} steps) "
                       f"to {last:.2f} (last {self.thresholds.window}); check samples.jsonl for padding or loops")

    def _flag(self, kind: str, step: int, message: str) -> None:
        if any(f["kind"] == kind for f in self.flags):
            return
        self.flags.append({"kind": kind, "step": step, "message": message})
        self.log.warning(f"reward-hacking watch, step {step}: {message}")
