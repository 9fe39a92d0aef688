"""The AdamW and learning-rate schedule settings RL's ``algorithm`` and SFT's ``sft`` sections share.

Each is a type carrying its constraint and description; a section declares it with its own default
(``max_grad_norm: MaxGradNorm = 1.0``), so both sections read the same and say the same in errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field


def _as_tuple(value: Any) -> Any:
    """A list (what YAML and JSON give) as a tuple: strict sections take only tuples for tuple fields."""
    return tuple(value) if isinstance(value, list) else value


# Two numbers, written as a list: ``[0.9, 0.999]``.
FloatPair = Annotated[tuple[float, float], BeforeValidator(_as_tuple)]
MaxGradNorm = Annotated[float, Field(gt=0, description="Clip the global gradient norm to this value.")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW weight decay.")]
AdamBetas = Annotated[FloatPair, Field(description="AdamW betas.")]
AdamEps = Annotated[float, Field(gt=0, description="AdamW epsilon.")]
LrScheduler = Annotated[Literal["constant", "cosine", "linear"], Field(description="Learning-rate schedule.")]
WarmupSteps = Annotated[int, Field(ge=0, description="Linear warm-up steps.")]
MinLrRatio = Annotated[float, Field(ge=0, le=1, description="Floor of cosine/linear decay as a fraction of peak.")]
