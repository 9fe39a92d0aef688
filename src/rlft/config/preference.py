"""The preference sections: pairs of a chosen and a rejected response (reward-model training and
DPO read the same data), the ``rm`` section of reward-model training and the ``dpo`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlft.config.optimizer import AdamBetas, AdamEps, LrScheduler, MaxGradNorm, MinLrRatio, WarmupSteps, WeightDecay
from rlft.config.sections import DataConfig, Section


class PreferenceDataConfig(DataConfig):
    """Each row is a preference pair. Two layouts: ``prompt`` + ``chosen`` + ``rejected`` strings
    (the prompt rendered as a user turn, each response as the assistant's reply), or ``chosen`` and
    ``rejected`` as whole conversations (lists of messages, TRL's conversational layout; their last
    assistant turn is what differs)."""

    chosen_field: str = Field("chosen", description="Column with the preferred response (or conversation).")
    rejected_field: str = Field("rejected", description="Column with the other response (or conversation).")
    margin_field: str | None = Field(
        None, description="Optional column with a per-pair margin m: the loss is -log sigmoid(r_c - r_r - m)."
    )
    max_length: int = Field(
        1024,
        gt=0,
        description="Most tokens in one side of a pair (prompt and response); a longer pair follows on_bad_row.",
    )


class RMSection(Section):
    """Reward-model training: a scalar head on the model, Bradley-Terry loss on preference pairs."""

    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate of AdamW.")
    batch_size: int = Field(8, gt=0, description="Pairs per optimizer step.")
    micro_batch_size: int = Field(8, gt=0, description="Pairs per forward/backward (gradient accumulation).")
    margin: float = Field(0.0, description="A constant margin added to every pair's (with margin_field: both).")
    center_rewards_coef: float = Field(
        0.0, ge=0, description="Weight of a (r_c + r_r)^2 penalty that keeps the scores centred on 0 (0: off)."
    )
    max_grad_norm: MaxGradNorm = 1.0
    weight_decay: WeightDecay = 0.0
    adam_betas: AdamBetas = (0.9, 0.999)
    adam_eps: AdamEps = 1e-8
    lr_scheduler: LrScheduler = "cosine"
    warmup_steps: WarmupSteps = 0
    min_lr_ratio: MinLrRatio = 0.0


class DPOSection(Section):
    """Direct preference optimisation: the policy learns from the pairs directly, against a frozen
    reference (the starting model)."""

    learning_rate: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL constraint to the reference.")
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid", description="'sigmoid' (Rafailov et al. 2023) or 'ipo' (Azar et al. 2023, squared loss)."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed share of flipped labels (cDPO); sigmoid loss only."
    )
    batch_size: int = Field(8, gt=0, description="Pairs per optimizer step.")
    micro_batch_size: int = Field(4, gt=0, description="Pairs per forward/backward (gradient accumulation).")
    max_grad_norm: MaxGradNorm = 1.0
    weight_decay: WeightDecay = 0.0
    adam_betas: AdamBetas = (0.9, 0.999)
    adam_eps: AdamEps = 1e-8
    lr_scheduler: LrScheduler = "cosine"
    warmup_steps: WarmupSteps = 0
    min_lr_ratio: MinLrRatio = 0.0
