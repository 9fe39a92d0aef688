"""The configuration of a run: one pydantic model per kind of job, built from shared sections.

A YAML file is one run. ``kind`` says which job it describes (``rl``, the default, so the
four-section RL file users already have keeps working; ``sft``); each kind has its own top-level
model listing the sections it uses, and :data:`JOB_KINDS` says which command runs it and which
job class trains it.  The sections themselves live in :mod:`rlft.config.sections` (model, data,
train, eval), :mod:`rlft.config.algorithm` (RL), :mod:`rlft.config.rewards` and
:mod:`rlft.config.sft`; they are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from rlft.config.algorithm import (
    GROUP_ESTIMATORS,
    AdvantageName,
    AggregationName,
    AlgorithmConfig,
    AlgorithmName,
    CriticConfig,
    PolicyLossName,
    RolloutConfig,
    vllm_problems,
)
from rlft.config.environment import EnvironmentConfig
from rlft.config.preference import DPOSection, PreferenceDataConfig, RMSection
from rlft.config.rewards import (
    ContainsReward,
    CustomReward,
    ExactAnswerReward,
    FormatReward,
    LengthPenaltyReward,
    NumericAnswerReward,
    RegexReward,
    RewardConfig,
    RewardSpec,
    ToolCallReward,
    default_reward_name,
)
from rlft.config.sections import BUILTIN_MODELS, CHAT_TEMPLATE_NAMES, DataConfig, LoraConfig, ModelConfig, Section
from rlft.config.sft import SFTDataConfig, SFTSection
from rlft.config.training import DistributedConfig, EvalConfig, HealthConfig, TrainConfig, WatchConfig

__all__ = [
    "BUILTIN_MODELS",
    "CHAT_TEMPLATE_NAMES",
    "GROUP_ESTIMATORS",
    "JOB_KINDS",
    "AdvantageName",
    "AggregationName",
    "AlgorithmConfig",
    "AlgorithmName",
    "ContainsReward",
    "CriticConfig",
    "EnvironmentConfig",
    "CustomReward",
    "DataConfig",
    "DistributedConfig",
    "EvalConfig",
    "ExactAnswerReward",
    "FormatReward",
    "JobKind",
    "LengthPenaltyReward",
    "LoraConfig",
    "ModelConfig",
    "NumericAnswerReward",
    "PolicyLossName",
    "RLConfig",
    "RegexReward",
    "RewardConfig",
    "RewardSpec",
    "DPOConfig",
    "DPOSection",
    "PreferenceDataConfig",
    "RMConfig",
    "RMSection",
    "RlftConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTSection",
    "Section",
    "ToolCallReward",
    "TrainConfig",
    "HealthConfig",
    "WatchConfig",
    "default_reward_name",
]

# Top-level sections in the order they are written out and reported.
SECTION_ORDER = (
    "kind",
    "model",
    "data",
    "algorithm",
    "rollout",
    "reward",
    "environment",
    "sft",
    "rm",
    "dpo",
    "train",
    "eval",
    "distributed",
)


class RunConfig(Section):
    """What every kind of run has: a model, data, the loop's length and cadence, evaluation."""

    kind: str
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model to train.")
    data: DataConfig = Field(..., description="Training and evaluation data.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Loop length, logging and checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="Data-parallel training under torchrun (ddp, fsdp2)."
    )

    def reward_names(self) -> list[str]:
        reward = getattr(self, "reward", None)
        return [r.name or default_reward_name(r) for r in reward.functions] if reward is not None else []

    def run_label(self) -> str:
        """Suffix of the default run directory name (``<date>-<time>-<label>``)."""
        return self.kind

    def _reward_problems(self) -> list[str]:
        """Problems with the rewards and the evaluation settings that refer to them."""
        names, problems = self.reward_names(), []
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"reward.functions: duplicate reward names {dupes}; give each a distinct 'name'")
        if self.eval.accuracy_reward is not None and self.eval.accuracy_reward not in names:
            problems.append(
                f"eval.accuracy_reward: '{self.eval.accuracy_reward}' is not one of the rewards {names}"
                if names
                else "eval.accuracy_reward: there are no rewards to measure accuracy with (add a reward: section)"
            )
        held_out = getattr(self.data, "eval_file", None) is not None or getattr(self.data, "eval_split", 0.0) > 0
        if self.train.save_best and not held_out:
            problems.append(
                "train.save_best: there is no held-out evaluation to judge the best model by "
                "(set data.eval_file or data.eval_split)"
            )
        too_big = sorted({k for k in self.eval.pass_k if k > self.eval.num_samples})
        if self.eval.num_samples > 0 and too_big:
            problems.append(
                f"eval.pass_k: {', '.join(map(str, too_big))} larger than eval.num_samples "
                f"({self.eval.num_samples}); pass@k needs k samples per prompt, so each k must be "
                f"between 1 and num_samples"
            )
        return problems


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


class RLConfig(RunConfig):
    """Reinforcement learning: sample, reward, advantage, policy update under a KL constraint."""

    kind: Literal["rl"] = Field("rl", description="The kind of job: rl (rlft train) or sft (rlft sft).")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm and its knobs.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation engine.")
    reward: RewardConfig = Field(..., description="Reward functions.")
    environment: EnvironmentConfig | None = Field(
        None, description="Multi-turn episodes with tools / an environment (absent: one completion per prompt)."
    )

    def run_label(self) -> str:
        return self.algorithm.name

    def reward_names(self) -> list[str]:
        # An environment's get_reward() is scored as the reward named "environment".
        return super().reward_names() + (["environment"] if self.environment is not None else [])

    @model_validator(mode="after")
    def _check_cross_fields(self) -> RLConfig:
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
            problems.append(
                f"algorithm.num_generations: {alg.advantage_estimator} compares completions of the "
                f"same prompt, so it needs at least 2 (got {alg.num_generations}); every advantage "
                f"would be 0"
            )
        if alg.dynamic_sampling and alg.num_generations < 2:
            problems.append(
                "algorithm.dynamic_sampling needs num_generations >= 2 (it drops groups whose rewards are all equal)"
            )
        if alg.kl_target is not None and alg.kl_coef <= 0:
            problems.append("algorithm.kl_target: the adaptive KL controller needs a starting kl_coef > 0")
        if alg.min_new_tokens > alg.max_new_tokens:
            problems.append(
                f"algorithm.min_new_tokens ({alg.min_new_tokens}) is larger than "
                f"algorithm.max_new_tokens ({alg.max_new_tokens})"
            )
        env = self.environment
        if not self.reward.functions and env is None:
            problems.append(
                "reward.functions: give at least one reward function (an empty list is only allowed "
                "with an environment: whose get_reward() is the reward)"
            )
        if env is not None and self.rollout.engine != "native":
            problems.append(
                f"rollout.engine: multi-turn episodes (environment:) need the native engine, which "
                f"controls generation token by token (got '{self.rollout.engine}')"
            )
        if self.rollout.engine == "vllm":
            problems += vllm_problems(self.model)
        if env is not None and alg.max_new_tokens > env.max_episode_tokens:
            problems.append(
                f"algorithm.max_new_tokens ({alg.max_new_tokens}, the budget of one turn) is larger "
                f"than environment.max_episode_tokens ({env.max_episode_tokens})"
            )
        _raise(problems + self._reward_problems())
        return self


class SFTConfig(RunConfig):
    """Supervised fine-tuning: cross-entropy on the assistant tokens of prompt/response rows or chats.

    ``reward`` is optional: when given, evaluation also generates a reply for every held-out row and
    scores it with these rewards, exactly as an RL run's evaluation does."""

    kind: Literal["sft"] = Field("sft", description="The kind of job: rl (rlft train) or sft (rlft sft).")
    data: SFTDataConfig = Field(..., description="Training and evaluation rows.")
    sft: SFTSection = Field(default_factory=SFTSection, description="Optimisation: learning rate, batch, packing.")
    reward: RewardConfig | None = Field(
        None, description="Optional: rewards for a generation evaluation on the held-out rows."
    )

    @model_validator(mode="after")
    def _check_cross_fields(self) -> SFTConfig:
        problems = []
        if self.sft.micro_batch_size > self.sft.batch_size:
            problems.append(
                f"sft.micro_batch_size ({self.sft.micro_batch_size}) is larger than sft.batch_size "
                f"({self.sft.batch_size}); it is the number of rows per forward/backward within one "
                f"optimizer step"
            )
        if self.reward is None and self.eval.num_samples > 0:
            problems.append(
                "eval.num_samples: sampled evaluation scores completions with rewards; add a reward: "
                "section (or set num_samples: 0)"
            )
        _raise(problems + self._reward_problems())
        return self


class RMConfig(RunConfig):
    """Reward-model training: a scalar score head on the model, trained on preference pairs with the
    Bradley-Terry loss; saved as a Hugging Face ``AutoModelForSequenceClassification`` folder."""

    kind: Literal["rm"] = Field("rm", description="The kind of job: rm (rlft train-rm).")
    data: PreferenceDataConfig = Field(..., description="Preference pairs for training and evaluation.")
    rm: RMSection = Field(default_factory=RMSection, description="Optimisation: learning rate, batch, margin.")

    @model_validator(mode="after")
    def _check_cross_fields(self) -> RMConfig:
        problems = []
        if self.rm.micro_batch_size > self.rm.batch_size:
            problems.append(
                f"rm.micro_batch_size ({self.rm.micro_batch_size}) is larger than rm.batch_size ({self.rm.batch_size})"
            )
        if self.model.lora is not None:
            problems.append(
                "model.lora: reward-model training trains the full model (LoRA for the score head "
                "is not supported yet); remove model.lora"
            )
        _raise(problems)
        return self


class DPOConfig(RunConfig):
    """Direct preference optimisation on preference pairs (the same data as reward-model training)."""

    kind: Literal["dpo"] = Field("dpo", description="The kind of job: dpo (rlft dpo).")
    data: PreferenceDataConfig = Field(..., description="Preference pairs for training and evaluation.")
    dpo: DPOSection = Field(default_factory=DPOSection, description="Optimisation: beta, loss, learning rate, batch.")

    def run_label(self) -> str:
        return "dpo" if self.dpo.loss == "sigmoid" else self.dpo.loss

    @model_validator(mode="after")
    def _check_cross_fields(self) -> DPOConfig:
        problems = []
        if self.dpo.micro_batch_size > self.dpo.batch_size:
            problems.append(
                f"dpo.micro_batch_size ({self.dpo.micro_batch_size}) is larger than dpo.batch_size "
                f"({self.dpo.batch_size})"
            )
        if self.dpo.label_smoothing and self.dpo.loss != "sigmoid":
            problems.append("dpo.label_smoothing: only the sigmoid loss has label smoothing")
        _raise(problems)
        return self


RlftConfig = RLConfig  # the name used before there were several kinds of job


@dataclass(frozen=True)
class JobKind:
    """One kind of training job: its config model, the command that runs it, and its job class
    (``module:Class``, imported only when a run of this kind starts). ``continuity``: the dotted
    config paths whose change breaks a resume of this kind (beyond the common ones of
    :mod:`rlft.checkpoint.continuity`), each with why. ``memory``: how the kind's step uses memory
    (``module:function`` of :mod:`rlft.planner.kinds`, for ``rlft estimate``)."""

    name: str
    config: type[RunConfig]
    command: str
    job: str
    summary: str
    continuity: dict[str, str]
    memory: str = ""
    data_parallel: bool = False  # its job runs under torchrun with distributed.strategy ddp/fsdp2


JOB_KINDS: dict[str, JobKind] = {
    "rl": JobKind(
        "rl",
        RLConfig,
        "rlft train",
        "rlft.rl.job:RLJob",
        "reinforcement learning (GRPO, PPO, ... on rewards)",
        {
            "algorithm.name": "the optimizer and critic state belong to the original algorithm",
            "algorithm.advantage_estimator": "the critic state belongs to the original estimator",
            "algorithm.rollout_batch_size": "the position in the data order counts batches of this size",
            "algorithm.num_generations": "the group size is part of the batch geometry",
            "algorithm.critic.type": "the saved critic has the original layout",
            "data.max_prompt_length": "the prompts would differ",
        },
        memory="rlft.planner.kinds:rl_phases",
        data_parallel=True,
    ),
    "sft": JobKind(
        "sft",
        SFTConfig,
        "rlft sft",
        "rlft.sft.job:SFTJob",
        "supervised fine-tuning on conversations, prompt/completion pairs or text",
        {
            "data.response_field": "the training rows would differ",
            "data.max_length": "which rows are kept, and how they are packed, depend on it",
            "sft.packing": "the data position counts rows, and packing makes other rows",
            "sft.batch_size": "the position in the data order counts batches of this size",
        },
        memory="rlft.planner.kinds:sft_phases",
    ),
    "rm": JobKind(
        "rm",
        RMConfig,
        "rlft train-rm",
        "rlft.rm.job:RMJob",
        "reward-model training on preference pairs (Bradley-Terry)",
        {
            "data.chosen_field": "the pairs would differ",
            "data.rejected_field": "the pairs would differ",
            "data.max_length": "which pairs are kept depends on it",
            "rm.batch_size": "the position in the data order counts batches of this size",
        },
        memory="rlft.planner.kinds:rm_phases",
    ),
    "dpo": JobKind(
        "dpo",
        DPOConfig,
        "rlft dpo",
        "rlft.dpo.job:DPOJob",
        "direct preference optimisation on preference pairs",
        {
            "data.chosen_field": "the pairs would differ",
            "data.rejected_field": "the pairs would differ",
            "data.max_length": "which pairs are kept depends on it",
            "dpo.batch_size": "the position in the data order counts batches of this size",
            "dpo.loss": "the optimizer state belongs to the original objective",
        },
        memory="rlft.planner.kinds:dpo_phases",
    ),
}
