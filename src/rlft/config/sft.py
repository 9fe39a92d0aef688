"""The SFT sections: ``sft`` (the optimisation) and the data fields only supervised rows have."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlft.config.optimizer import AdamBetas, AdamEps, LrScheduler, MaxGradNorm, MinLrRatio, WarmupSteps, WeightDecay
from rlft.config.sections import DataConfig, Section


class SFTDataConfig(DataConfig):
    """Training rows are in one of TRL's formats, recognised by their columns (``messages``, ``prompt`` +
    ``completion``, ``text``; rlft's own ``prompt`` + ``response`` too), or in the columns named here:
    whole conversations (``messages_field``, tool calls and tool results included) or prompt/response
    pairs (``prompt_field`` + ``response_field``)."""

    response_field: str | None = Field(
        None,
        description="Column holding the target response of prompt/response rows; null: 'completion' (TRL's "
        "name) or 'response', whichever the row has. Setting it (or a prompt_field other than 'prompt') reads "
        "every row as a prompt/response pair.",
    )
    max_length: int = Field(
        2048, gt=0, description="Most tokens in one example (the whole conversation); longer rows follow on_bad_row."
    )


class SFTSection(Section):
    learning_rate: float = Field(2e-5, gt=0, description="Peak learning rate of AdamW.")
    batch_size: int = Field(8, gt=0, description="Rows per optimizer step (a packed row holds several examples).")
    micro_batch_size: int = Field(4, gt=0, description="Rows per forward/backward (gradient accumulation).")
    packing: bool = Field(
        False,
        description="Pack short examples into rows of data.max_length tokens; examples in one row never "
        "attend to each other.",
    )
    train_on: Literal["assistant", "last_assistant"] = Field(
        "assistant", description="Train on every assistant turn, or only on each conversation's last one."
    )
    max_grad_norm: MaxGradNorm = 1.0
    weight_decay: WeightDecay = 0.0
    adam_betas: AdamBetas = (0.9, 0.999)
    adam_eps: AdamEps = 1e-8
    lr_scheduler: LrScheduler = "cosine"
    warmup_steps: WarmupSteps = 0
    min_lr_ratio: MinLrRatio = 0.0
