"""Which estimator and loss each ``algorithm.name`` uses: data, not branches in the trainer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmPreset:
    advantage: str
    policy_loss: str


PRESETS: dict[str, AlgorithmPreset] = {
    "grpo": AlgorithmPreset(advantage="grpo", policy_loss="ppo_clip"),
}
