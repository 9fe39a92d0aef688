"""Which estimator and loss each ``algorithm.name`` uses: data, not branches in the trainer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmPreset:
    advantage: str
    policy_loss: str


# grpo: Shao et al. 2024 (DeepSeekMath). Same as the paper: G samples per prompt, group-normalised
# outcome advantages, PPO clipped ratio, KL to the reference as a k3 term in the loss (not the reward).
# Departures (all configurable): the default loss aggregation is token_mean over the batch (DAPO's
# choice; the paper averages per sequence first: loss_aggregation=seq_mean_token_mean); the default is
# one optimizer step per rollout batch (ppo_epochs=1), so the ratio is 1 and the clip only matters
# with ppo_epochs > 1 or mini-batches; kl_coef=0 drops the reference model entirely.
PRESETS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset(advantage="grpo", policy_loss="ppo_clip"),
}
