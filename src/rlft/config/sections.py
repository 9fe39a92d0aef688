"""The configuration sections every kind of run shares: model and data, and the base every section
derives from (train, eval and the rest: :mod:`rlft.config.training`).

Every field has a default and a one-line ``description``.  Unknown keys are rejected so that a
typo never silently falls back to a default.  No torch import: validation stays fast.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlft.config.references import FilePath, Reference

BUILTIN_MODELS = ("smollm2-135m-instruct",)
# A finite number as text, as YAML 1.2 spells one (Section._float_from_text).
_FLOAT_TEXT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
# data.chat_template values that name a template rather than a .jinja file (rlft.chat.templates has them).
CHAT_TEMPLATE_NAMES = ("auto", "tokenizer", "hermes")
# A model folder, a .gguf file or a built-in model's name.
ModelPath = Annotated[str, Reference("model", BUILTIN_MODELS)]


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are re-validated on assignment.

    Types are strict, because a lax reading hides mistakes: ``max_steps: true`` is not 1, ``save_optimizer: 1``
    or ``"yes"`` is not a boolean, an integer field takes no float. A float field takes an integer
    (``learning_rate: 1``) but never ``.inf`` or ``.nan``: those train to non-finite weights and the run
    still ends "completed"."""

    # protected_namespaces: pydantic before 2.10 reserves every "model_" name and warns at import about a field
    # such as critic.model_path; its own methods' names are reserved whatever this says
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False, protected_namespaces=()
    )

    @model_validator(mode="before")
    @classmethod
    def _floats_from_text(cls, data: Any) -> Any:
        """A float field takes a number written as text (``'2e-6'``): yaml.safe_load (YAML 1.1) reads an
        exponent without a dot as a string, and configs parsed by it reach the loader (the job service's)."""
        if not isinstance(data, dict):
            return data
        floats = {f.alias or name for name, f in cls.model_fields.items() if _takes_float(f.annotation)}
        return {
            key: float(value)
            if key in floats and isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip())
            else value
            for key, value in data.items()
        }


def _takes_float(annotation: Any) -> bool:
    """Whether a field's type is ``float`` or a union with it (``float | None``)."""
    return annotation is float or (get_origin(annotation) in (Union, types.UnionType) and float in get_args(annotation))


# --------------------------------------------------------------------------- model


class LoraConfig(Section):
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: list[str] | str = Field(
        "all-linear",
        description="Module names to adapt, or 'all-linear' for every linear layer but the LM head.",
    )


class ModelConfig(Section):
    path: ModelPath = Field(
        "smollm2-135m-instruct",
        description=f"A Hugging Face model directory, a .gguf file, or a built-in name ({', '.join(BUILTIN_MODELS)}).",
    )
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Compute dtype. bf16 keeps fp32 master weights and runs matmuls under bf16 autocast. "
        "auto: bf16 where it is faster (a GPU with bf16; a CPU whose bf16 matmul, timed once at start, beats "
        "fp32's), else fp32.",
    )
    gradient_checkpointing: bool | Literal["auto", "selective"] = Field(
        "auto",
        description="Recompute activations in the backward to save memory. true: every layer's forward "
        "(about 30 % slower); selective: only the elementwise work (norms, activation functions, casts), keeping "
        "the matmuls' outputs (under half the activation memory, a few per cent slower); false: nothing. auto: "
        "selective on a GPU, off on a CPU, and true where one sequence of the longest length a run can produce "
        "would not fit its activation budget otherwise (RL runs; SFT, DPO and reward-model runs leave it off).",
    )
    compile: bool = Field(
        False,
        description="Compile each decoder layer's training and scoring forward with torch.compile (the work "
        "between its matmuls fused, forward and backward; the backward recomputes what gradient_checkpointing "
        "says). Compiling takes up to a minute at the first steps, cached after; off until measured on a GPU.",
    )
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter instead of all weights.")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")


# --------------------------------------------------------------------------- data


class DataConfig(Section):
    train_file: FilePath = Field(
        ...,
        description="Training rows: .jsonl, .json, .csv or .parquet, or a folder written "
        "by datasets' save_to_disk. Rows in TRL's standard formats load by their column "
        "names (docs/data.md).",
    )
    eval_file: FilePath | None = Field(None, description="Held-out prompts for evaluation (same format).")
    eval_split: float = Field(
        0.0, ge=0, lt=1, description="Fraction of train_file held out for evaluation when eval_file is not set."
    )
    prompt_field: str = Field("prompt", description="Column holding the prompt text.")
    messages_field: str | None = Field(
        None,
        description="Column holding a chat in the Hugging Face format (a list of {role, content}, assistant "
        "tool_calls and tool results included); used instead of prompt_field.",
    )
    system_prompt: str | None = Field(None, description="System message prepended to every prompt.")
    use_chat_template: bool = Field(True, description="Format prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(512, gt=0, description="Prompts longer than this many tokens are left-truncated.")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="What to do with a malformed row: stop with an error, or skip it and count it."
    )
    shuffle: bool = Field(True, description="Shuffle the training rows every epoch (seeded).")
    chat_template: Annotated[str, Reference("file", CHAT_TEMPLATE_NAMES)] = Field(
        "auto",
        description="'auto': the tokenizer's own template, or the built-in Hermes tool template when tools "
        "appear and the tokenizer's cannot render them; 'tokenizer'; 'hermes'; or a path to a .jinja file.",
    )
    tools_field: str = Field(
        "tools",
        description="Column holding a row's tools (JSON schemas) for the chat template; rows without it have none.",
    )
