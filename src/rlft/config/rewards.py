"""The ``reward`` section: built-in rule rewards and custom functions, combined by weight."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rlft.config.optimizer import FloatPair
from rlft.config.references import CodeRef, ModelDir, Reference, UrlRef
from rlft.config.sections import ModelPath, Section


class _Reward(Section):
    weight: float = Field(1.0, description="Weight of this reward in the total.")
    name: str | None = Field(None, description="Name used in logs (defaults to the type or function name).")


class ContainsReward(_Reward):
    type: Literal["contains"]
    keyword: str = Field(..., min_length=1, description="Reward 1.0 if this text occurs in the completion, else 0.0.")
    case_sensitive: bool = Field(True, description="Match case exactly.")


class RegexReward(_Reward):
    type: Literal["regex"]
    pattern: str = Field(..., description="Python regular expression.")
    mode: Literal["search", "fullmatch"] = Field(
        "search", description="re.search anywhere, or re.fullmatch of the stripped completion."
    )


class ExactAnswerReward(_Reward):
    type: Literal["exact_answer"]
    answer_field: str = Field("answer", description="Column holding the reference answer.")
    extract: Literal["full", "last_line", "boxed", "after_marker"] = Field(
        "full", description="Which part of the completion is compared with the answer."
    )
    marker: str = Field("####", description="With extract=after_marker: the text after the last marker is the answer.")
    case_sensitive: bool = Field(False, description="Compare case exactly.")


class NumericAnswerReward(_Reward):
    type: Literal["numeric_answer"]
    answer_field: str = Field("answer", description="Column holding the reference number.")
    extract: Literal["only", "last", "first"] = Field(
        "last", description="'only': the completion must be just a number; else the last/first number in it."
    )
    tolerance: float = Field(1e-6, ge=0, description="Absolute tolerance for equality.")
    closeness: bool = Field(
        False,
        description="A wrong number scores 1 / (1 + |difference|) instead of 0: wrong answers are ranked by how "
        "far they are, so a group whose answers are all wrong but differ still says which are closer.",
    )


class FormatReward(_Reward):
    type: Literal["format"]
    pattern: str | None = Field(None, description="Regex the whole (stripped) completion must match.")
    required_tags: list[str] = Field(
        default_factory=list, description="Tag names that must each appear once as <tag>...</tag>, in this order."
    )


class LengthPenaltyReward(_Reward):
    type: Literal["length_penalty"]
    target_chars: int = Field(200, ge=0, description="Completions up to this many characters get no penalty.")
    penalty_per_char: float = Field(
        0.001, ge=0, description="Penalty per character beyond target_chars (returned negative)."
    )
    max_penalty: float = Field(1.0, ge=0, description="Cap on the penalty.")


class ToolCallReward(_Reward):
    type: Literal["tool_call"]
    tools_field: str = Field(
        "tools",
        description="Column with the row's tools: when present, each call must name one of them and give "
        "its required arguments.",
    )


class LocalCodeReward(_Reward):
    """A reward that runs the user's own code in the trainer's process, under a time limit per call."""

    timeout: float | None = Field(
        300.0,
        gt=0,
        description="Seconds one call (one batch) may take: a slower or hung call fails the run with a "
        "reward error naming the function; a call over half of it is warned about. null: no limit, and the "
        "function runs on the calling thread (for code that needs the main thread, e.g. signal-based timeouts).",
    )


class CustomReward(LocalCodeReward):
    type: Literal["custom"]
    function: CodeRef = Field(
        ...,
        description="'package.module:function' or 'path/to/file.py:function' with the TRL signature "
        "f(prompts, completions, **columns) -> list[float].",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments passed on every call.")


class HttpReward(_Reward):
    """Scores from a scoring service (OpenRLHF's remote reward model, or ``rlft serve-reward``): each
    batch is POSTed as JSON ``{"prompts", "completions", "columns"}`` and the answer must be
    ``{"rewards": [one number per completion]}`` (a bare list is accepted too)."""

    type: Literal["http"]
    url: UrlRef = Field(
        ..., pattern=r"^https?://", description="The scoring endpoint, e.g. http://127.0.0.1:8001/score."
    )
    timeout: float = Field(30.0, gt=0, description="Seconds one request may take before it counts as failed.")
    retries: int = Field(
        3,
        ge=0,
        description="Retries of a request that failed transiently (connection error, "
        "timeout, 5xx, 429), with exponential backoff.",
    )
    backoff: float = Field(0.5, ge=0, description="Seconds before the first retry; doubled each time.")
    batch_size: int = Field(64, ge=1, description="Completions per request.")
    max_concurrency: int = Field(4, ge=1, description="Requests in flight at once.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (an Authorization token).")
    send_columns: bool = Field(True, description="Send the data row's other columns (answers, metadata) too.")


class ModelReward(_Reward):
    """Scores from a reward model (a checkpoint of ``rlft train-rm``, or any Hugging Face sequence
    classifier with one output): the prompt and completion are rendered as one user/assistant
    exchange with the reward model's own chat template and scored in batches. Loaded once."""

    type: Literal["model"]
    path: ModelDir = Field(..., description="The reward model's folder.")
    batch_size: int = Field(16, ge=1, description="Sequences per scoring forward.")
    output: Literal["logit", "sigmoid", "standardized"] = Field(
        "logit",
        description="What the reward is: the raw score (a logit: unbounded, not a probability), "
        "sigmoid(score) in (0, 1), or the score standardised by its running mean and std "
        "over every batch so far.",
    )
    clip: float | None = Field(None, gt=0, description="Clip the reward to [-clip, clip] after the transform.")
    max_length: int = Field(1024, gt=0, description="Longer inputs keep their last max_length tokens.")
    device: str = Field("auto", description="'auto' (the GPU if there is one), 'cpu', 'cuda' or 'cuda:N'.")
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="How it scores: bf16 stores its Linear weights in bf16 and scores under bf16 autocast (half "
        "the memory, about twice the speed; a score moves in its third significant digit); auto is bf16 where "
        "bf16 matmuls are native and faster (a recent GPU, some CPUs), as model.dtype's auto.",
    )


DEFAULT_RUBRIC = (
    "Rate how well the response answers the request, from 0 (useless) to 10 (perfect).\n\n"
    "Request:\n{prompt}\n\nResponse:\n{completion}\n\nReply with one line: Score: <number>"
)
DEFAULT_GROUP_RUBRIC = (
    "Here are {n} responses to the same request. Rate each from 0 (useless) to 10 (perfect), judging them "
    "against each other.\n\nRequest:\n{prompt}\n\n{completions}\n\nReply with one line per response: "
    "<number of the response>: <score>"
)


class JudgeReward(_Reward):
    """Another model as the judge (verl's generative reward model; ART's RULER in group mode): a rubric
    prompt is filled in, the judge answers greedily, and the score is parsed from its answer. An
    answer without a score gets ``fallback`` and is counted (``reward/<name>/unparsable``), never a
    silent 0."""

    type: Literal["judge"]
    model: ModelPath | None = Field(
        None, description="A model rlft can load (folder, .gguf or built-in name) as the judge, run in this process."
    )
    url: UrlRef | None = Field(
        None,
        pattern=r"^https?://",
        description="Or an OpenAI-compatible chat-completions endpoint (http://host:port/v1/chat/completions).",
    )
    api_model: str | None = Field(None, description="The model name sent to that endpoint.")
    device: str = Field(
        "auto", description="Where a local judge (model) runs: 'auto' (the GPU if there is one), 'cpu', 'cuda'..."
    )
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="How a local judge (model) computes: bf16 stores its Linear weights in bf16 and generates "
        "under bf16 autocast (half the memory); auto is bf16 where bf16 matmuls are native and faster, as "
        "model.dtype's auto.",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers for the endpoint.")
    mode: Literal["single", "group"] = Field(
        "single",
        description="'single': one judge call per completion; 'group': one call per prompt scoring its "
        "completions against each other (relative scores are all GRPO needs).",
    )
    rubric: str | None = Field(
        None,
        description="The judge's prompt: {prompt} and {completion} ('single'), or "
        "{prompt}, {n} and {completions} ('group'). Default: a 0-10 rubric.",
    )
    score_pattern: str = Field(
        r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", description="'single': a regex whose first group is the score."
    )
    scale: FloatPair = Field(
        (0.0, 10.0),
        description="The rubric's range; scores are mapped to [0, 1] and a score outside it counts as unparsable.",
    )
    fallback: float = Field(0.0, description="The reward of a completion whose judgement has no usable score.")
    max_new_tokens: int = Field(64, ge=1, description="Most tokens of one judgement.")
    timeout: float = Field(60.0, gt=0, description="Seconds one endpoint request may take.")
    retries: int = Field(3, ge=0, description="Retries of an endpoint request that failed transiently.")

    @model_validator(mode="after")
    def _one_judge(self) -> JudgeReward:
        if (self.model is None) == (self.url is None):
            raise ValueError("give exactly one of model (a local judge) and url (an OpenAI-compatible endpoint)")
        if self.scale[1] <= self.scale[0]:
            raise ValueError(f"scale: the top ({self.scale[1]}) must be above the bottom ({self.scale[0]})")
        return self


class VerifiersReward(LocalCodeReward):
    """The rubric of an environment written with the ``verifiers`` package (the classic API): its reward
    functions and weights score each completion, its group functions each prompt's completions
    together, and each function's value is logged (``reward/<name>/<function>``)."""

    type: Literal["verifiers"]
    env: Annotated[str, Reference("code")] = Field(
        ..., description="The environment: an installed one (module or Hub id) or 'path/to/env.py'."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of its load_environment().")


RewardSpec = Annotated[
    ContainsReward
    | RegexReward
    | ExactAnswerReward
    | NumericAnswerReward
    | FormatReward
    | LengthPenaltyReward
    | ToolCallReward
    | CustomReward
    | HttpReward
    | ModelReward
    | JudgeReward
    | VerifiersReward,
    Field(discriminator="type"),
]


class RewardConfig(Section):
    functions: list[RewardSpec] = Field(
        ..., description="Reward functions; the total is their weighted sum (with an environment's get_reward())."
    )


def default_reward_name(spec: Any) -> str:
    """The name a reward gets in logs when the config gives it none: the function name or the type."""
    if getattr(spec, "type", None) == "custom":
        return spec.function.rsplit(":", 1)[-1]
    return spec.type
