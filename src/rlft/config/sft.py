"""The SFT sections: ``sft`` (the optimisation) and the data fields only supervised rows have."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlft.config.sections import DataConfig, Section


class SFTDataConfig(DataConfig):
    """Training rows are prompt/response pairs (``prompt_field`` + ``response_field``) or whole
    conversations (``messages_field``, tool calls and tool results included)."""

    response_field: str = Field("response", description="Column holding the target response (prompt/response rows).")
    max_length: int = Field(
        2048, gt=0, description="Most tokens in one example (the whole conversation); longer rows follow on_bad_row.")


class SFTSection(Section):
    learning_rate: float = Field(2e-5, gt=0, description="Peak learning rate of AdamW.")
    batch_size: int = Field(8, gt=0, description="Rows per optimizer step (a packed row holds several examples).")
    micro_batch_size: int = Field(4, gt=0, description="Rows per forward/backward (gradient accumulation).")
    packing: bool = Field(
        False, description="Pack short examples into rows of data.max_length tokens; examples in one row never "
        "attend to each other.")
    train_on: Literal["assistant", "last_assistant"] = Field(
        "assistant", description="Train on every assistant turn, or only on each conversation's last one.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler: Literal["constant", "cosine", "linear"] = Field("cosine", description="Learning-rate schedule.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Floor of cosine/linear decay as a fraction of peak.")
