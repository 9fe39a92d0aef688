"""The configuration schema: one pydantic model per YAML section.

Every field has a default and a one-line ``description`` (shown by
``rlft config --help``-style tooling and in error messages).  Unknown keys are
rejected so that a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlft.config.presets import apply_preset

BUILTIN_MODELS = ("smollm2-135m-instruct",)
# The advantage estimators registered with the trait group_relative=True, spelled out here so that config
# validation never imports torch (tests/algorithms/test_registry.py checks the two agree).
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    path: str = Field(
        "smollm2-135m-instruct",
        description="A Hugging Face model directory, a .gguf file, or a built-in name "
        f"({', '.join(BUILTIN_MODELS)}).",
    )
    dtype: Literal["fp32", "bf16"] = Field(
        "bf16", description="Compute dtype. bf16 keeps fp32 master weights and runs matmuls under bf16 autocast."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    lora: LoraConfig | None = Field(None, description="Train a LoRA adapter instead of all weights.")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")


# --------------------------------------------------------------------------- data


class DataConfig(Section):
    train_file: str = Field(..., description="Training prompts: .jsonl, .json, .csv or .parquet.")
    eval_file: str | None = Field(None, description="Held-out prompts for evaluation (same format).")
    eval_split: float = Field(
        0.0, ge=0, lt=1, description="Fraction of train_file held out for evaluation when eval_file is not set."
    )
    prompt_field: str = Field("prompt", description="Column holding the prompt text.")
    messages_field: str | None = Field(
        None, description="Column holding a chat as a list of {role, content}; used instead of prompt_field."
    )
    system_prompt: str | None = Field(None, description="System message prepended to every prompt.")
    use_chat_template: bool = Field(True, description="Format prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(512, gt=0, description="Prompts longer than this many tokens are left-truncated.")
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="What to do with a malformed row: stop with an error, or skip it and count it."
    )
    shuffle: bool = Field(True, description="Shuffle the training prompts every epoch (seeded).")


# --------------------------------------------------------------------------- algorithm


AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"]
AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
PolicyLossName = Literal["ppo_clip", "dual_clip", "gspo", "reinforce"]
AggregationName = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


class CriticConfig(Section):
    type: Literal["separate", "value_head"] = Field(
        "separate",
        description="'separate': a value model with its own backbone (initialised from model_path); "
        "'value_head': a linear head on the policy's own (detached) hidden states, no second backbone.",
    )
    model_path: str | None = Field(None, description="Backbone of a separate critic (default: the policy's model).")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate of the critic's AdamW.")
    value_loss: Literal["clipped_mse", "mse"] = Field("clipped_mse", description="Value loss.")
    value_clip: float = Field(0.2, gt=0, description="How far (in reward units) values may move from the rollout's.")
    warmup_steps: int = Field(0, ge=0, description="Train only the critic for this many first steps.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the critic's gradient norm to this value.")


class AlgorithmConfig(Section):
    """``name`` picks vetted defaults (rlft.config.presets); every other field overrides one of them."""

    name: AlgorithmName = Field("grpo", description="RL algorithm; selects the defaults of the fields below.")
    advantage_estimator: AdvantageName = Field("grpo", description="How rewards become advantages.")
    policy_loss: PolicyLossName = Field("ppo_clip", description="Policy-gradient loss.")
    loss_aggregation: AggregationName = Field("token_mean", description="How per-token losses are reduced to one number.")
    learning_rate: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    kl_coef: float = Field(0.04, ge=0, description="Weight of the KL penalty to the reference policy (0 disables it).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Per-token KL estimator.")
    kl_placement: Literal["in_loss", "in_reward"] = Field(
        "in_loss", description="Add KL to the loss, or subtract kl_coef x KL from each token's reward.")
    kl_target: float | None = Field(
        None, gt=0, description="Adapt kl_coef to keep the mean per-token KL near this value (None: fixed coef).")
    kl_horizon: int = Field(10000, gt=0, description="Adaptive KL controller horizon, in rollout samples.")
    rollout_batch_size: int = Field(16, gt=0, description="Prompts sampled per training step.")
    num_generations: int = Field(8, gt=0, description="Completions sampled per prompt (the group size).")
    max_new_tokens: int = Field(256, gt=0, description="Maximum tokens generated per completion.")
    min_new_tokens: int = Field(
        0, ge=0, description="End-of-sequence is not sampled before this many tokens (benchmarks: fixed-length work)."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold for rollouts.")
    top_k: int = Field(0, ge=0, description="Top-k sampling for rollouts (0 = off).")
    clip_low: float = Field(0.2, gt=0, description="PPO ratio clip below 1 (ratio >= 1 - clip_low).")
    clip_high: float = Field(0.2, gt=0, description="PPO ratio clip above 1 (ratio <= 1 + clip_high; DAPO raises it).")
    dual_clip_c: float = Field(3.0, gt=1, description="dual_clip loss: bound on the loss of negative advantages.")
    scale_rewards: bool = Field(True, description="grpo estimator: divide group-centred rewards by the group std.")
    gamma: float = Field(1.0, gt=0, le=1, description="Discount for token-level returns (reinforce_pp, gae).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    whiten_advantages: bool = Field(True, description="gae: normalise advantages over the batch.")
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and sample more prompts until the batch is full.")
    max_sampling_rounds: int = Field(
        4, gt=0, description="Dynamic sampling: at most this many generation rounds per step.")
    overlong_buffer: float = Field(
        0.0, ge=0, lt=1, description="Soft overlong penalty over the last fraction of max_new_tokens (0 = off).")
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at max_new_tokens when overlong_buffer > 0.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (advantage_estimator: gae).")
    ppo_epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    mini_batch_size: int | None = Field(
        None, gt=0, description="Sequences per optimizer step (default: the whole rollout batch)."
    )
    micro_batch_size: int = Field(8, gt=0, description="Sequences per forward/backward (gradient accumulation).")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler: Literal["constant", "cosine", "linear"] = Field("constant", description="Learning-rate schedule.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Floor of cosine/linear decay as a fraction of peak.")

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data: Any) -> Any:
        return apply_preset(data) if isinstance(data, dict) else data

    def uses_reference(self) -> bool:
        return self.kl_coef > 0


class RolloutConfig(Section):
    engine: Literal["native", "hf"] = Field(
        "native", description="'native': shared-prompt prefill, finished rows leave the batch; 'hf': transformers generate."
    )


# --------------------------------------------------------------------------- rewards


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
    mode: Literal["search", "fullmatch"] = Field("search", description="re.search anywhere, or re.fullmatch of the stripped completion.")


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


class FormatReward(_Reward):
    type: Literal["format"]
    pattern: str | None = Field(None, description="Regex the whole (stripped) completion must match.")
    required_tags: list[str] = Field(
        default_factory=list, description="Tag names that must each appear once as <tag>...</tag>, in this order."
    )


class LengthPenaltyReward(_Reward):
    type: Literal["length_penalty"]
    target_chars: int = Field(200, ge=0, description="Completions up to this many characters get no penalty.")
    penalty_per_char: float = Field(0.001, ge=0, description="Penalty per character beyond target_chars (returned negative).")
    max_penalty: float = Field(1.0, ge=0, description="Cap on the penalty.")


class CustomReward(_Reward):
    type: Literal["custom"]
    function: str = Field(
        ...,
        description="'package.module:function' or 'path/to/file.py:function' with the TRL signature "
        "f(prompts, completions, **columns) -> list[float].",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments passed on every call.")


RewardSpec = Annotated[
    Union[
        ContainsReward,
        RegexReward,
        ExactAnswerReward,
        NumericAnswerReward,
        FormatReward,
        LengthPenaltyReward,
        CustomReward,
    ],
    Field(discriminator="type"),
]


class RewardConfig(Section):
    functions: list[RewardSpec] = Field(..., min_length=1, description="Reward functions; the total is their weighted sum.")


# --------------------------------------------------------------------------- train / eval


class WatchConfig(Section):
    """Reward-hacking watch thresholds (warnings in the log and in eval/step-N.json)."""

    window: int = Field(5, gt=0, description="Steps averaged at the start and end of a growth comparison.")
    length_growth: float = Field(0.5, gt=0, description="Flag mean completion length growing by this fraction.")
    repetition_growth: float = Field(0.15, gt=0, description="Flag the mean repetition score rising by this much.")
    accuracy_drop: float = Field(0.05, ge=0, description="Flag eval accuracy this far below its best ...")
    reward_rise: float = Field(0.05, ge=0, description="... while the training reward rose by at least this much.")
    dominance: float = Field(0.9, gt=0, le=1, description="Flag one reward carrying this share of the reward variation ...")
    patience: int = Field(5, gt=0, description="... for this many steps in a row.")


class TrainConfig(Section):
    epochs: int = Field(1, gt=0, description="Passes over the training prompts.")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many steps even if epochs remain.")
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    output_dir: str = Field("./outputs", description="Runs are written to <output_dir>/<run_name>/.")
    run_name: str | None = Field(None, description="Run directory name (default: <date>-<time>-<algorithm>).")
    logging_interval: int = Field(10, gt=0, description="Write metrics/log lines every N steps.")
    save_interval: int = Field(200, gt=0, description="Save a checkpoint every N steps (and always at the end).")
    watch: WatchConfig = Field(default_factory=WatchConfig, description="Reward-hacking watch thresholds.")
    keep_last: int | None = Field(
        None, gt=0, description="Keep only the newest N complete checkpoints (older ones are deleted after a save).")
    samples_per_log: int = Field(4, ge=0, description="Prompt/completion pairs written to samples.jsonl per logging step.")
    progress_bar: Literal["auto", "on", "off"] = Field("auto", description="Progress bar: on a terminal only (auto), always, never.")


class EvalConfig(Section):
    before_training: bool = Field(True, description="Evaluate the model before the first step.")
    after_training: bool = Field(True, description="Evaluate the model after the last step.")
    interval: int = Field(0, ge=0, description="Also evaluate every N steps (0 = never during training).")
    max_samples: int | None = Field(None, gt=0, description="Evaluate on at most this many eval prompts.")
    max_new_tokens: int | None = Field(None, gt=0, description="Generation budget (default: algorithm.max_new_tokens).")
    batch_size: int = Field(32, gt=0, description="Prompts per generation batch.")
    accuracy_reward: str | None = Field(
        None, description="Name of the reward that defines accuracy (default: the first reward)."
    )
    success_threshold: float = Field(1.0, description="A sample counts as correct when that reward is >= this value.")
    num_samples: int = Field(
        0, ge=0, description="Also sample this many completions per prompt for sampled accuracy and pass@k "
        "(0 = greedy only; sampled batches hold at most batch_size sequences).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of those num_samples completions.")
    pass_k: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [1], description="Report pass@k for each k (each 1 <= k <= num_samples).")


class RlftConfig(Section):
    """The whole run configuration (one YAML file)."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    data: DataConfig = Field(..., description="Training and evaluation data.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm and its knobs.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation engine.")
    reward: RewardConfig = Field(..., description="Reward functions.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Loop length, logging and checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "RlftConfig":
        alg = self.algorithm
        problems = []
        if alg.mini_batch_size is not None:
            total = alg.rollout_batch_size * alg.num_generations
            if alg.mini_batch_size > total:
                problems.append(
                    f"algorithm.mini_batch_size ({alg.mini_batch_size}) is larger than the rollout batch "
                    f"(rollout_batch_size x num_generations = {total})"
                )
        if alg.advantage_estimator in GROUP_ESTIMATORS and alg.num_generations < 2:
            problems.append(f"algorithm.num_generations: {alg.advantage_estimator} compares completions of the "
                            f"same prompt, so it needs at least 2 (got {alg.num_generations}); every advantage "
                            f"would be 0")
        if alg.dynamic_sampling and alg.num_generations < 2:
            problems.append("algorithm.dynamic_sampling needs num_generations >= 2 (it drops groups whose "
                            "rewards are all equal)")
        if alg.kl_target is not None and alg.kl_coef <= 0:
            problems.append("algorithm.kl_target: the adaptive KL controller needs a starting kl_coef > 0")
        if alg.min_new_tokens > alg.max_new_tokens:
            problems.append(f"algorithm.min_new_tokens ({alg.min_new_tokens}) is larger than "
                            f"algorithm.max_new_tokens ({alg.max_new_tokens})")
        names = [r.name or _default_reward_name(r) for r in self.reward.functions]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"reward.functions: duplicate reward names {dupes}; give each a distinct 'name'")
        if self.eval.accuracy_reward is not None and self.eval.accuracy_reward not in names:
            problems.append(f"eval.accuracy_reward: '{self.eval.accuracy_reward}' is not one of the rewards {names}")
        too_big = sorted({k for k in self.eval.pass_k if k > self.eval.num_samples})
        if self.eval.num_samples > 0 and too_big:
            problems.append(f"eval.pass_k: {', '.join(map(str, too_big))} larger than eval.num_samples "
                            f"({self.eval.num_samples}); pass@k needs k samples per prompt, so each k must be "
                            f"between 1 and num_samples")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def reward_names(self) -> list[str]:
        return [r.name or _default_reward_name(r) for r in self.reward.functions]


def _default_reward_name(spec: Any) -> str:
    if getattr(spec, "type", None) == "custom":
        return spec.function.rsplit(":", 1)[-1]
    return spec.type
