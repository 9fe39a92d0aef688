"""The RL sections: ``algorithm`` (with its critic) and ``rollout``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from rlft.config.optimizer import AdamBetas, AdamEps, LrScheduler, MaxGradNorm, MinLrRatio, WarmupSteps, WeightDecay
from rlft.config.presets import apply_preset
from rlft.config.sections import ModelPath, Section

# The advantage estimators registered with the trait group_relative=True, spelled out here so that config
# validation never imports torch (tests/algorithms/test_registry.py checks the two agree).
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")

# Each rollout engine's own keyword arguments -> the rollout: field that sets it (the engines are
# rlft.rollout.ENGINES; a test keeps the two lists of names the same).
ENGINE_OPTIONS: dict[str, dict[str, str]] = {
    "native": {"cuda_graphs": "cuda_graphs", "compile_decode": "compile_decode"},
    "hf": {},
    "vllm": {
        "gpu_memory_utilization": "vllm_gpu_memory_utilization",
        "sleep_between_steps": "vllm_sleep_between_steps",
    },
}

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
    model_path: ModelPath | None = Field(
        None, description="Backbone of a separate critic (default: the policy's model)."
    )
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
    loss_aggregation: AggregationName = Field(
        "token_mean", description="How per-token losses are reduced to one number."
    )
    learning_rate: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    kl_coef: float = Field(0.04, ge=0, description="Weight of the KL penalty to the reference policy (0 disables it).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Per-token KL estimator.")
    kl_placement: Literal["in_loss", "in_reward"] = Field(
        "in_loss", description="Add KL to the loss, or subtract kl_coef x KL from each token's reward."
    )
    kl_target: float | None = Field(
        None, gt=0, description="Adapt kl_coef to keep the mean per-token KL near this value (None: fixed coef)."
    )
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
    tied_group_weight: float = Field(
        0.0,
        ge=0,
        description="grpo, dr_grpo: a group whose completions all got one reward is compared with the "
        "whole batch, with this weight, instead of getting advantage 0 (a settled wrong answer is pushed down).",
    )
    gamma: float = Field(1.0, gt=0, le=1, description="Discount for token-level returns (reinforce_pp, gae).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    whiten_advantages: bool = Field(True, description="gae: normalise advantages over the batch.")
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and sample more prompts until the batch is full."
    )
    max_sampling_rounds: int = Field(
        4, gt=0, description="Dynamic sampling: at most this many generation rounds per step."
    )
    overlong_buffer: float = Field(
        0.0, ge=0, lt=1, description="Soft overlong penalty over the last fraction of max_new_tokens (0 = off)."
    )
    overlong_penalty: float = Field(1.0, ge=0, description="Penalty at max_new_tokens when overlong_buffer > 0.")
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Truncated importance sampling: weight each token's policy-gradient term by "
        "min(pi_old / pi_rollout, tis_cap), correcting for the rollout engine's log-probs differing from the "
        "trainer's (vLLM, bf16 decoding; 2.0 is the usual cap). None: off. The trainer then computes its own old "
        "log-probs.",
    )
    exclude_machinery_failures: bool = Field(
        True,
        description="Leave a completion the machinery ended -- a tool timeout, a crashed environment worker, "
        "an HTTP reward or API judge still down after its retries -- out of its group's baseline and out of the "
        "loss (counted as excluded/* each step), instead of stopping the run on the reward outage and scoring the "
        "failure as the policy's. False: such completions count like any other and a reward outage stops the run.",
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (advantage_estimator: gae).")
    ppo_epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    mini_batch_size: int | None = Field(
        None, gt=0, description="Sequences per optimizer step (default: the whole rollout batch)."
    )
    micro_batch_size: PositiveInt | Literal["auto"] = Field(
        "auto",
        description="Sequences per forward/backward (gradient accumulation). 'auto': as many as fit a token "
        "budget of half the device's memory after the model states, at each batch's own length, up to the whole "
        "batch (the log states the budget); on a CPU a batch of more than 4096 tokens goes in even passes of at "
        "least 2048, as fast and with less memory.",
    )
    max_grad_norm: MaxGradNorm = 1.0
    weight_decay: WeightDecay = 0.0
    adam_betas: AdamBetas = (0.9, 0.999)
    adam_eps: AdamEps = 1e-8
    lr_scheduler: LrScheduler = "constant"
    warmup_steps: WarmupSteps = 0
    min_lr_ratio: MinLrRatio = 0.0

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data: Any) -> Any:
        return apply_preset(data) if isinstance(data, dict) else data

    def uses_reference(self) -> bool:
        return self.kl_coef > 0


class RolloutConfig(Section):
    engine: Literal["native", "hf", "vllm"] = Field(
        "native",
        description="'native': shared-prompt prefill, finished rows leave the batch; 'hf': transformers "
        "generate; 'vllm': vLLM on the training GPU, the policy's weights pushed into it after each optimizer step "
        "(pip install 'rlft[vllm]'; a CUDA GPU, model.dtype bf16).",
    )
    decode_copy: bool | Literal["auto"] = Field(
        "auto",
        description="With model.dtype bf16, generate from a bf16 copy of the weights refreshed after each "
        "optimizer step (2 bytes a parameter while generating: it is freed for the update and made again for the "
        "next rollout; the reference model is kept in bf16, which pays for it). False: "
        "generate from the fp32 weights under autocast, which casts every weight at every token. Under LoRA the "
        "copy has the adapters merged in (a plain model's decode, for a second copy of the base); false decodes "
        "the frozen bf16 base as it is with the adapters unmerged (engine native, fused_decode): no copy, a small "
        "product more in every decode matmul. 'auto' (the default): true, except for a LoRA policy whose run "
        "rlft's memory plan says does not fit with the merged copy: false then, said in the log.",
    )
    fused_decode: bool = Field(
        True,
        description="Decode Llama-family models (llama, mistral, qwen2) with rlft's one-token forward over a "
        "preallocated KV cache (fused q/k/v and gate/up matmuls; under bf16, oneDNN-packed bf16 weights), single-turn "
        "and multi-turn episodes alike; False: the model's own forward.",
    )
    cuda_graphs: bool = Field(
        True,
        description="engine native on a CUDA GPU: capture the fused decode step as a CUDA graph once per rollout "
        "and replay it for every token (one launch instead of hundreds; finished rows stay in the batch, masked). "
        "False: launch the step's kernels one by one.",
    )
    compile_decode: bool = Field(
        False,
        description="engine native, fused decode on a GPU: compile each decode layer's work between its matmuls "
        "with torch.compile (norms, rotary, attention, SiLU and residual adds fused into a few kernels; one "
        "compilation for every layer, window and batch, once per process: seconds to a minute at start-up). Off by "
        "default until its speed-up on a GPU is measured (scripts/gpu_scale.sh's rlft-compiled rows); where "
        "compiling fails, the layer runs as PyTorch ops with one warning.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        lt=1,
        description="engine vllm: the share of the GPU's memory vLLM takes for its bf16 weights and "
        "KV cache; the rest stays with training (the policy, its gradients and optimizer state, the reference).",
    )
    vllm_sleep_between_steps: bool = Field(
        True,
        description="engine vllm: release vLLM's weights and KV cache while the policy trains (vLLM sleep "
        "mode, level 2), so training has that memory; the weights are pushed again at wake-up.",
    )

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments of the chosen engine beyond the common ones (none for hf)."""
        return {kwarg: getattr(self, field) for kwarg, field in ENGINE_OPTIONS[self.engine].items()}


def vllm_problems(model: Any) -> list[str]:
    """Why ``rollout.engine: vllm`` cannot run with this ``model:`` section (none: it can, as far as a
    config can tell; a missing GPU or package is reported when the engine is built)."""
    problems = []
    if model.device.strip().lower() == "cpu":
        problems.append(
            "rollout.engine: vllm runs vLLM on a CUDA GPU, colocated with training, but model.device "
            "is 'cpu'; set model.device: cuda (or auto), or use rollout.engine: native"
        )
    if model.dtype == "fp32":  # auto is bf16 on any GPU vLLM runs on
        problems.append(
            f"rollout.engine: vllm samples in bf16; it needs model.dtype: bf16 (got '{model.dtype}'), "
            f"whose old log-probs the trainer recomputes itself"
        )
    return problems
