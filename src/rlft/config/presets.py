"""What each ``algorithm.name`` means: the estimator, loss and defaults it selects.

A preset is data, not a branch in the trainer: it lists the ``algorithm.*`` fields whose
defaults differ from the schema's (which are GRPO's).  A field the user sets always wins.
Each entry says where the preset departs from its paper; the pure functions in
``rlft.algorithms`` document their own departures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AlgorithmPreset:
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset(
        "GRPO (Shao et al. 2024): group-normalised outcome advantages, PPO clip, k3 KL in the loss. "
        "Departures: token_mean aggregation by default (the paper averages per sequence first: "
        "loss_aggregation=seq_mean_token_mean); one optimizer step per rollout unless ppo_epochs/"
        "mini_batch_size say otherwise; kl_coef=0 drops the reference model.",
    ),
    "dr_grpo": AlgorithmPreset(
        "Dr. GRPO (Liu et al. 2025): GRPO without the std division and without per-sequence length "
        "normalisation (token sums over a fixed max_new_tokens). No KL, as in the paper's runs.",
        {"advantage_estimator": "dr_grpo", "loss_aggregation": "seq_mean_token_sum_norm", "kl_coef": 0.0},
    ),
    "dapo": AlgorithmPreset(
        "DAPO (Yu et al. 2025): clip-higher (0.2 / 0.28), dynamic sampling of groups with reward "
        "variance, token-level loss, soft overlong penalty over the last 20% of max_new_tokens, no KL. "
        "Departure: the overlong buffer is a fraction of max_new_tokens (the paper: 4096 of 20480 tokens).",
        {
            "clip_high": 0.28,
            "kl_coef": 0.0,
            "dynamic_sampling": True,
            "overlong_buffer": 0.2,
            "loss_aggregation": "token_mean",
        },
    ),
    "gspo": AlgorithmPreset(
        "GSPO (Zheng et al. 2025): sequence-level, length-normalised importance ratio clipped at "
        "3e-4 / 4e-4, group-normalised advantages, per-sequence loss averaging, no KL.",
        {
            "policy_loss": "gspo",
            "clip_low": 3e-4,
            "clip_high": 4e-4,
            "loss_aggregation": "seq_mean_token_mean",
            "kl_coef": 0.0,
        },
    ),
    "rloo": AlgorithmPreset(
        "RLOO (Ahmadian et al. 2024): leave-one-out baseline, KL (k1) folded into the sequence reward. "
        "Departure: the PPO clipped loss instead of plain REINFORCE (identical with one step per rollout, "
        "safer with more); token sums over max_new_tokens per sequence (the paper's sequence "
        "log-likelihood up to a constant).",
        {
            "advantage_estimator": "rloo",
            "kl_placement": "in_reward",
            "kl_estimator": "k1",
            "kl_coef": 0.05,
            "loss_aggregation": "seq_mean_token_sum_norm",
        },
    ),
    "reinforce_pp": AlgorithmPreset(
        "REINFORCE++ (Hu et al. 2025): per-token k1 KL in the reward, discounted returns whitened over "
        "the batch, PPO clip, no critic.",
        {"advantage_estimator": "reinforce_pp", "kl_placement": "in_reward", "kl_estimator": "k1", "kl_coef": 0.01},
    ),
    "ppo": AlgorithmPreset(
        "PPO for language models (Ouyang et al. 2022): a learned critic and GAE (gamma 1, lambda 0.95), "
        "per-token k1 KL in the reward, clipped policy and value losses, 2 epochs per rollout. "
        "Departures: the critic starts from the policy's weights (no reward model to start from); "
        "advantages are whitened over the batch.",
        {
            "advantage_estimator": "gae",
            "kl_placement": "in_reward",
            "kl_estimator": "k1",
            "kl_coef": 0.02,
            "ppo_epochs": 2,
        },
    ),
}


def apply_preset(algorithm: dict[str, Any]) -> dict[str, Any]:
    """The raw ``algorithm`` section with the named preset's defaults filled in where unset."""
    preset = PRESETS.get(algorithm.get("name", "grpo"))
    if preset is None:
        return algorithm  # the schema reports the unknown name with the valid ones
    return {**preset.defaults, **algorithm}
