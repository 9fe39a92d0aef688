"""Completions the machinery ended, not the policy, and leaving them out of the step.

A tool that timed out, an environment worker that died mid-episode, a reward service still down
after its retries: the completion's reward says nothing about the policy. With
``algorithm.exclude_machinery_failures`` (the default) such a row is left out of its group's
baseline (``AdvantageInputs.valid``) and out of the loss (its loss mask is zeroed, so it adds
nothing to the policy loss, the KL or the entropy either), and each step counts them:
``excluded/<reason>`` and ``excluded/total`` (from the run's first such row on). Off, the same counts
are logged as ``machinery_failures/<reason>`` and the rows are trained on like any other.

A step where every row of every process is excluded has nothing to learn from: its update is
skipped with a warning, and after ``patience`` such steps in a row the run stops (a service that
stays down would otherwise burn the whole run's compute on nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlft.errors import EnvironmentFailure, RewardOutage

# Finish reasons of episodes the machinery ended (see rlft.rollout.episode.EpisodeStats).
MACHINERY_FINISHES = ("tool_timeout", "env_error")
REASONS = MACHINERY_FINISHES + ("reward_outage",)


@dataclass
class Exclusion:
    """valid: [N] bool, False on the rows left out of the step, or None (nothing is left out);
    metrics: this step's counts of rows by reason."""

    valid: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


def machinery_failures(finish_reasons: list[str], reward_failed: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """[N] bool per reason in :data:`REASONS`: the rows that reason ended or could not score."""
    out = {r: torch.tensor([f == r for f in finish_reasons], dtype=torch.bool) for r in MACHINERY_FINISHES}
    out["reward_outage"] = (
        reward_failed.bool().cpu() if reward_failed is not None else torch.zeros(len(finish_reasons), dtype=torch.bool)
    )
    return out


def exclude_rows(batch, valid: torch.Tensor | None) -> None:
    """Zero the loss mask ([N, T]) of ``batch``'s rows that are not ``valid`` [N]: they add nothing to
    the loss or to the statistics taken over the loss tokens (KL, entropy, clip fraction), and
    (``batch.valid``) are not counted as sequences by a per-sequence loss mean."""
    if valid is not None and not bool(valid.all()):
        mask = batch.loss_mask
        batch.loss_mask = mask * valid.to(mask.device, mask.dtype).unsqueeze(-1)
        batch.valid = valid.to(mask.device)


class ExclusionPolicy:
    """Decides each step which rows count, and watches for steps where none does."""

    def __init__(self, enabled: bool, logger, patience: int = 5):
        self.enabled, self.log, self.patience = enabled, logger, patience
        self.empty_steps = 0
        self.seen = False  # has the machinery failed on any row of this run yet

    def report(self, metrics: dict[str, float], keys) -> None:
        """Keep this step's counts (``keys`` of ``metrics``, already summed over the processes) from the
        run's first failure on, and leave them out before: a run the machinery never failed logs what it
        always did. Every process sees the same sums, so all keep or drop the same keys."""
        self.seen = self.seen or any(metrics.get(k) for k in keys)
        if not self.seen:
            for key in keys:
                metrics.pop(key, None)

    def assess(self, finish_reasons: list[str], reward_failed: torch.Tensor | None) -> Exclusion:
        """The rows of this process's batch that count, and the step's counts by reason."""
        failures = machinery_failures(finish_reasons, reward_failed)
        prefix = "excluded" if self.enabled else "machinery_failures"
        metrics = {f"{prefix}/{r}": float(failures[r].sum()) for r in REASONS}
        failed = torch.zeros(len(finish_reasons), dtype=torch.bool)
        for rows in failures.values():
            failed |= rows
        if not self.enabled:
            return Exclusion(None, metrics)
        metrics["excluded/total"] = float(failed.sum())
        return Exclusion(~failed, metrics)

    def anything_left(self, step: int, rows_left: float, counts: dict[str, float]) -> bool:
        """Whether the step has rows to learn from; ``rows_left``: valid rows over every process,
        ``counts``: the step's ``excluded/*`` counts (over every process). Raises after ``patience``
        steps in a row with none."""
        if rows_left > 0:
            self.empty_steps = 0
            return True
        self.empty_steps += 1
        why = ", ".join(f"{int(v)} {k.split('/')[-1]}" for k, v in counts.items() if v and k != "excluded/total")
        self.log.warning(
            f"step {step}: every completion was ended or left unscored by the machinery ({why}); "
            f"the update is skipped ({self.empty_steps} such steps in a row, the run stops at "
            f"{self.patience}). Check the reward service / environment, or set "
            f"algorithm.exclude_machinery_failures: false to train on them anyway"
        )
        if self.empty_steps >= self.patience:
            error = RewardOutage if counts.get("excluded/reward_outage") else EnvironmentFailure
            raise error(
                f"{self.empty_steps} steps in a row ending at step {step} had every completion "
                f"ended or left unscored by the machinery ({why}); stopping instead of training on "
                f"nothing"
            )
        return False
