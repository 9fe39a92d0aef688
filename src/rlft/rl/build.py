"""Builds the parts of an RL step from a validated config: data, rollout collector, updater, critic."""

from __future__ import annotations

from rlft.config.schema import RLConfig
from rlft.logging.console import get_logger
from rlft.trainer.parts import ModelParts


def build_data(cfg: RLConfig, tokenizer):
    """Train and (optional) eval prompt sets; logs counts and skipped rows."""
    from rlft.data.prompts import load_prompts, log_loaded
    from rlft.rl.episodes import env_tools

    tools = env_tools(cfg)
    train = load_prompts(cfg.data, tokenizer, "train", cfg.train.seed, tools)
    evalset = load_prompts(cfg.data, tokenizer, "eval", cfg.train.seed, tools)
    log_loaded(get_logger(), train, evalset, "prompts")
    return train, evalset


def hyperparameter_pool(cfg: RLConfig) -> dict:
    """The algorithm section's plain values: registered functions take the ones they declare by name."""
    return cfg.algorithm.model_dump(exclude={"critic"})


def build_updater(cfg: RLConfig, parts: ModelParts, total_steps: int, dist=None):
    """Optimizer, lr schedule and the policy updater, from the algorithm section."""
    from rlft.rl.update import PolicyUpdater, UpdateParams
    from rlft.trainer.optim import build_optimizer, build_scheduler

    alg = cfg.algorithm
    rollout_rows = alg.rollout_batch_size * alg.num_generations
    steps_per_update = alg.ppo_epochs * -(-rollout_rows // (alg.mini_batch_size or rollout_rows))
    optimizer = build_optimizer(
        parts.model.parameters(),
        lr=alg.learning_rate,
        weight_decay=alg.weight_decay,
        betas=alg.adam_betas,
        eps=alg.adam_eps,
    )
    scheduler = build_scheduler(
        optimizer,
        total_steps=total_steps * steps_per_update,
        warmup_steps=alg.warmup_steps * steps_per_update,
        schedule=alg.lr_scheduler,
        min_ratio=alg.min_lr_ratio,
    )
    micro, micro_tokens, full_speed = micro_batching(cfg, parts)
    params = UpdateParams(
        loss_name=alg.policy_loss,
        loss_params=hyperparameter_pool(cfg),
        kl_estimator=alg.kl_estimator,
        kl_in_loss=alg.kl_placement == "in_loss",
        aggregation=alg.loss_aggregation,
        temperature=alg.temperature,
        ppo_epochs=alg.ppo_epochs,
        mini_batch_size=alg.mini_batch_size,
        micro_batch_size=micro,
        micro_batch_tokens=micro_tokens,
        micro_batch_full_speed=full_speed,
        max_grad_norm=alg.max_grad_norm,
        max_len=alg.max_new_tokens,
    )
    return PolicyUpdater(parts.model, parts.reference, optimizer, scheduler, params, parts.autocast_dtype, dist)


def micro_batching(cfg: RLConfig, parts: ModelParts, log: bool = True) -> tuple[int, int | None, int | None]:
    """``algorithm.micro_batch_size`` as (rows per forward/backward, token budget, full-speed pass size):
    a fixed number of rows and no budget, or for ``auto`` the whole batch as the cap, a token budget
    from the device's memory (:func:`rlft.models.memory.activation_token_budget`) and the pass size past
    which splitting costs no speed (:func:`rlft.models.memory.full_speed_tokens`)."""
    from rlft.models.memory import full_speed_tokens, pass_tokens, rows_for

    alg = cfg.algorithm
    rows = alg.mini_batch_size or alg.rollout_batch_size * alg.num_generations
    longest = cfg.data.max_prompt_length + (
        cfg.environment.max_episode_tokens if cfg.environment is not None else alg.max_new_tokens
    )
    tokens, why = _activation_budget(cfg, parts, longest, log)
    full_speed = full_speed_tokens(parts.device.type, sum(p.numel() for p in parts.model.parameters()))
    if alg.micro_batch_size == "auto":
        if log:
            split = (
                f"; a batch of more than {2 * full_speed} tokens goes in passes of at least {full_speed} "
                f"(as fast here, less memory)"
                if full_speed
                else ""
            )
            get_logger().info(f"micro_batch_size auto: {why}{split}")
        return rows, tokens, full_speed
    # what 'auto' takes at the longest length (counting each row's prompt, as memory does)
    nominal = rows * longest
    auto_rows = rows_for(pass_tokens(tokens, rows, nominal, nominal, full_speed), rows, longest)
    if log and alg.micro_batch_size < auto_rows:
        get_logger().warning(
            f"algorithm.micro_batch_size {alg.micro_batch_size} splits each update into "
            f"{-(-rows // alg.micro_batch_size)} forward/backward passes; 'auto' would take "
            f"{auto_rows} rows at once here (fewer, larger matmuls)"
        )
    return alg.micro_batch_size, None, None


def _activation_budget(cfg: RLConfig, parts: ModelParts, longest: int, log: bool) -> tuple[int, str]:
    """The activation token budget. With ``model.gradient_checkpointing: auto`` the update's layers recompute
    their elementwise work (``selective``) on a GPU, and everything (``full``) wherever one sequence of the
    longest length the run can produce does not fit the budget otherwise (:mod:`rlft.models.checkpointing`)."""
    from rlft.models.checkpointing import enable_gradient_checkpointing, recompute_mode
    from rlft.models.memory import activation_token_budget, auto_recompute, resident_bytes
    from rlft.planner.scorers import scorer_bytes

    params = sum(p.numel() for p in parts.model.parameters())
    trainable = sum(p.numel() for p in parts.model.parameters() if p.requires_grad)
    scorers, _ = scorer_bytes(cfg, parts.device.type, longest)  # reward models and judges beside the policy
    resident = resident_bytes(params, trainable, parts.reference is not None) + scorers
    budget = lambda mode: activation_token_budget(  # noqa: E731
        parts.model,
        device=parts.device,
        resident_bytes=resident,
        compute_bytes=2 if parts.autocast_dtype is not None else 4,
        recompute=mode,
    )
    setting, mode = cfg.model.gradient_checkpointing, recompute_mode(parts.model)
    plain, _ = budget("off")
    if setting == "auto" and mode == "off":
        mode = auto_recompute(parts.device.type, lambda m: budget(m)[0] >= longest)
        if mode != "off":
            enable_gradient_checkpointing(parts.model, mode)
    tokens, why = budget(mode)
    if not log:
        return tokens, why
    if setting == "auto" and mode == "selective":
        get_logger().info(
            "model.gradient_checkpointing auto: selective on a GPU (the update's layers recompute their norms, "
            f"activation functions and casts in the backward and keep the matmuls' outputs: {plain} -> {tokens} "
            "tokens fit the activation budget)"
        )
    elif setting == "auto" and mode == "full":
        get_logger().warning(
            f"model.gradient_checkpointing auto: on, because one sequence of up to {longest} tokens would not fit "
            f"the activation budget ({plain} tokens); recomputing activations in the backward fits {tokens}"
        )
    elif setting is True and plain >= longest:
        get_logger().warning(
            f"model.gradient_checkpointing is true, but one sequence of up to {longest} tokens "
            f"fits the activation budget ({plain} tokens) without it: recomputing every "
            f"layer's forward makes the update slower ('auto' would leave it off)"
        )
    return tokens, why


def warn_slow_rollout(cfg: RLConfig, parts: ModelParts) -> None:
    """One warning line for each rollout setting that is the slow choice for this model and hardware."""
    from rlft.speed.fused_decode import unsupported_reason

    rollout, log = cfg.rollout, get_logger()
    fusable = unsupported_reason(parts.model) is None
    if rollout.engine == "native" and not rollout.fused_decode and fusable:
        log.warning(
            "rollout.fused_decode is false: this model could decode with rlft's fused decode, which is "
            "faster than its own forward (2.2x the decoded tokens/s on SmolLM2 in bf16 on a 2-core CPU, "
            "benchmarks/multi_turn.py)"
        )
    # a LoRA policy's fused decode without the copy reads its bf16 base as it is (rlft.speed.lora_decode)
    unmerged = cfg.model.lora is not None and rollout.engine == "native" and rollout.fused_decode and fusable
    if parts.autocast_dtype is not None and not rollout.decode_copy and not unmerged:
        log.warning(
            "rollout.decode_copy is false under bf16: every decode step casts all fp32 weights to bf16, "
            "which makes generation slower than in fp32"
        )


def build_critic(cfg: RLConfig, parts: ModelParts, dist=None):
    """The PPO critic (value model, optimizer, updater), or None if the estimator needs no values."""
    from rlft.algorithms import ADVANTAGES

    alg = cfg.algorithm
    if not ADVANTAGES.trait(alg.advantage_estimator, "needs_values"):
        return None
    from rlft.models.checkpointing import recompute_mode
    from rlft.models.sources import resolve_model_dir
    from rlft.models.value import build_value_model
    from rlft.rl.critic import CriticParams, CriticUpdater
    from rlft.trainer.optim import build_optimizer

    ccfg = alg.critic
    model_dir = resolve_model_dir(ccfg.model_path) if ccfg.model_path else parts.model_dir
    model = build_value_model(ccfg.type, parts.model, model_dir, recompute=recompute_mode(parts.model))
    optimizer = build_optimizer(
        model.parameters(),
        lr=ccfg.learning_rate,
        weight_decay=0.0,
        betas=alg.adam_betas,
        eps=alg.adam_eps,
    )
    micro, micro_tokens, full_speed = micro_batching(cfg, parts, log=False)
    params = CriticParams(
        value_loss=ccfg.value_loss,
        value_clip=ccfg.value_clip,
        ppo_epochs=alg.ppo_epochs,
        mini_batch_size=alg.mini_batch_size,
        micro_batch_size=micro,
        micro_batch_tokens=micro_tokens,
        micro_batch_full_speed=full_speed,
        max_grad_norm=ccfg.max_grad_norm,
    )
    n_train = sum(p.numel() for p in model.trainable_parameters())
    get_logger().info(
        f"critic: {ccfg.type} ({'backbone ' + str(model_dir) + ', ' if ccfg.type == 'separate' else ''}"
        f"{n_train / 1e6:.2f}M trainable parameters, lr {ccfg.learning_rate:g}, "
        f"{ccfg.warmup_steps} warm-up steps)"
    )
    return CriticUpdater(model, optimizer, params, parts.autocast_dtype, dist)


def build_advantage_stage(cfg: RLConfig, dist=None):
    from rlft.rl.advantage import AdvantageStage, KLController

    alg = cfg.algorithm
    stage = AdvantageStage(
        alg.advantage_estimator,
        alg.num_generations,
        alg.kl_estimator,
        kl_in_reward=alg.kl_placement == "in_reward",
        params=hyperparameter_pool(cfg),
        reduce=dist.all_reduce if dist is not None and dist.enabled else None,
    )
    return stage, KLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)


def build_collector(cfg: RLConfig, engine, rewards, train_set, sampler, dist=None):
    from rlft.rl.collect import CollectParams, RolloutCollector
    from rlft.rollout import SamplingParams

    alg = cfg.algorithm
    sampling = SamplingParams(
        max_new_tokens=alg.max_new_tokens,
        min_new_tokens=alg.min_new_tokens,
        n=alg.num_generations,
        temperature=alg.temperature,
        top_p=alg.top_p,
        top_k=alg.top_k,
    )
    params = CollectParams(
        sampling,
        alg.rollout_batch_size,
        overlong_buffer=alg.overlong_buffer,
        overlong_penalty=alg.overlong_penalty,
        dynamic_sampling=alg.dynamic_sampling,
        max_rounds=alg.max_sampling_rounds,
        seed=cfg.train.seed,
        exclude_machinery_failures=alg.exclude_machinery_failures,
    )
    return RolloutCollector(engine, rewards, train_set, sampler, params, dist)
