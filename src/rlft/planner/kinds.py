"""How each kind of job uses memory: its step geometry and phases (``JobKind.memory`` names these).

Each function takes the validated config, the model's :class:`ModelShape`, the target
:class:`DeviceSpec` and the longest prompt in tokens, and returns the :class:`Geometry` and the
phases of one step (:mod:`rlft.planner.phases`).
"""

from __future__ import annotations

from types import SimpleNamespace

from rlft.planner.devices import DeviceSpec
from rlft.planner.phases import (
    Geometry,
    Phases,
    decode_copy_bytes,
    generation_bytes,
    lora_merge_bytes,
    reference_bytes,
    scoring_bytes,
    trained_bytes,
    unmerged_decode_bytes,
    update_bytes,
)
from rlft.planner.scorers import scorer_bytes
from rlft.planner.shape import ModelShape


def _budget_tokens(shape: ModelShape, device: DeviceSpec, resident: int, compute_bytes: int, recompute: str) -> int:
    """Tokens one forward/backward may hold by the rule the run itself applies
    (:func:`rlft.models.memory.activation_token_budget`), from the device's total memory."""
    from rlft.models.memory import activation_bytes_per_token

    config = SimpleNamespace(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
    )
    per_token = activation_bytes_per_token(config, compute_bytes, recompute)
    return max((device.total - resident) // 2, per_token) // per_token


def _auto_rows(
    shape: ModelShape,
    device: DeviceSpec,
    rows: int,
    seq: int,
    resident: int,
    compute_bytes: int,
    recompute: str,
    computed: int | None = None,
) -> int:
    """The rows ``micro_batch_size: auto`` takes at once; ``computed``: the tokens one pass over all
    ``rows`` runs (a group's prompt once), for the CPU's full-speed split
    (:func:`rlft.models.memory.pass_tokens`)."""
    from rlft.models.memory import full_speed_tokens, pass_tokens, rows_for

    tokens = _budget_tokens(shape, device, resident, compute_bytes, recompute)
    full_speed = full_speed_tokens(device.kind, shape.params)
    if full_speed is not None and computed is not None:
        tokens = pass_tokens(tokens, rows, rows * seq, computed, full_speed)
    return rows_for(tokens, rows, seq)


def _recompute(setting, device: DeviceSpec, fits=None) -> str:
    """The update's recompute mode (:mod:`rlft.models.checkpointing`), as the run chooses it
    (:func:`rlft.models.memory.auto_recompute` for ``auto``); ``fits(mode)``: one sequence of the
    longest length fits the activation budget so (None: a job that leaves ``auto`` off)."""
    from rlft.models.checkpointing import configured_mode
    from rlft.models.memory import auto_recompute

    mode = configured_mode(setting)
    if mode is None:
        return auto_recompute(device.kind, fits) if fits is not None else "off"
    return mode


def rl_phases(
    cfg, shape: ModelShape, device: DeviceSpec, prompt_tokens: int, compute_bytes: int
) -> tuple[Geometry, Phases]:
    """Rollout, reward models' scoring (:mod:`rlft.planner.scorers`), scoring, update (and a separate critic's
    update), and evaluation."""
    from rlft.models.memory import resident_bytes

    alg, lora = cfg.algorithm, cfg.model.lora is not None
    new = cfg.environment.max_episode_tokens if cfg.environment is not None else alg.max_new_tokens
    rows = alg.rollout_batch_size * alg.num_generations
    update_rows = alg.mini_batch_size or rows
    seq = prompt_tokens + new
    scorers, scoring = scorer_bytes(cfg, device.kind, seq)
    resident = resident_bytes(shape.params, shape.trainable, alg.uses_reference() and not lora) + scorers
    # 'auto' recomputes when the longest sequence the config allows does not fit, and selectively on a GPU
    longest = cfg.data.max_prompt_length + new
    fits = lambda mode: _budget_tokens(shape, device, resident, compute_bytes, mode) >= longest  # noqa: E731
    recompute = _recompute(cfg.model.gradient_checkpointing, device, fits)
    computed = -(-update_rows // alg.num_generations) * prompt_tokens + update_rows * new
    micro = (
        _auto_rows(shape, device, update_rows, seq, resident, compute_bytes, recompute, computed)
        if alg.micro_batch_size == "auto"
        else min(alg.micro_batch_size, update_rows)
    )
    g = Geometry(
        rows=rows,
        prompts=alg.rollout_batch_size,
        prompt_tokens=prompt_tokens,
        new_tokens=new,
        micro_rows=micro,
        compute_bytes=compute_bytes,
        recompute=recompute,
        group=alg.num_generations,
        device_kind=device.kind,
        **_eval_geometry(cfg, new),
    )
    kept, trained, graphed, merge = _rl_kept(cfg, shape, device, compute_bytes)
    if scorers:
        kept, trained = {**kept, "reward models": scorers}, {**trained, "reward models": scorers}
    one_pass = micro >= update_rows and device.kind == "cuda"  # see update_bytes
    generation = generation_bytes(shape, rows, g.prompts, prompt_tokens, new, compute_bytes, graphed)
    # a merged LoRA copy's refresh comes before the prefill: what it briefly takes beyond the generation's tensors
    merging = {"lora merge": merge - sum(generation.values())} if merge > sum(generation.values()) else {}
    phases: Phases = {
        "rollout": {**kept, **generation, **merging},
        "scoring": {**kept, **scoring_bytes(shape, g)},
        "update": {**trained, **update_bytes(shape, g, one_pass=one_pass)},
    }
    if scoring:
        phases["reward"] = {**kept, "scoring batch": scoring}
    if separate_critic(alg):
        phases["critic update"] = {**trained, **update_bytes(shape, g, head=False, one_pass=one_pass)}
    if g.eval_rows:
        phases["evaluation"] = {
            **kept,
            **generation_bytes(
                shape, g.eval_rows, g.eval_rows, prompt_tokens, g.eval_new_tokens, compute_bytes, graphed
            ),
        }
    return g, phases


def _rl_kept(cfg, shape: ModelShape, device: DeviceSpec, compute_bytes: int) -> tuple[dict, dict, bool, int]:
    """What an RL step keeps through its phases; the same in the update, where the engine has freed the decode
    copy's Linears the optimizer step rewrites (rlft.rollout.base.RolloutEngine.release_memory); whether
    the decode runs as CUDA graphs; and what refreshing a merged LoRA copy briefly takes (:func:`lora_merge_bytes`)."""
    from rlft.speed.fused_decode import SUPPORTED

    r, lora = cfg.rollout, cfg.model.lora is not None
    # the native engine's fused decode of a Llama-family model: graphed on a GPU, packed on a CPU
    fused = r.engine == "native" and r.fused_decode and shape.model_type in SUPPORTED
    graphed = fused and device.kind == "cuda" and r.cuda_graphs
    packed = fused and device.kind == "cpu"
    unmerged = lora and fused and (not r.decode_copy or compute_bytes == 4)  # rlft.rollout.native_engine
    if unmerged:
        copy = unmerged_decode_bytes(shape, compute_bytes, packed, _frozen_linear_bytes(cfg, compute_bytes))
    else:
        shared = _shared_head_bytes(cfg, shape, compute_bytes)
        copy = decode_copy_bytes(shape, compute_bytes, lora, packed, shared) if r.decode_copy else 0
    released = 0 if unmerged else min(copy, _decode_copy_released(cfg, shape))
    kept = {
        **trained_bytes(shape, _frozen_linear_bytes(cfg, compute_bytes)),
        "reference": reference_bytes(shape, compute_bytes, lora) if cfg.algorithm.uses_reference() else 0,
        "decode weights": copy,
        **_critic_kept(cfg, shape),
    }
    merge = lora_merge_bytes(shape, cfg.model.lora.target_modules) if lora and copy and not unmerged else 0
    return kept, {**kept, "decode weights": copy - released}, graphed, merge


def _shared_head_bytes(cfg, shape: ModelShape, compute_bytes: int) -> int:
    """The LM head a LoRA policy's merged decode copy reads from the policy itself (rlft.speed.decode_weights):
    untied, no adapter on it, and stored in the compute dtype like the rest of the frozen base."""
    lora = cfg.model.lora
    if lora is None or shape.tied_embeddings or _frozen_linear_bytes(cfg, compute_bytes) != compute_bytes:
        return 0
    return 0 if "lm_head" in lora.target_modules else compute_bytes * shape.vocab * shape.hidden


def _frozen_linear_bytes(cfg, compute_bytes: int) -> int:
    """Bytes a LoRA base's Linear weight takes a parameter: the compute dtype's, except under fsdp2
    (rlft.trainer.parts.build_model)."""
    return compute_bytes if cfg.model.lora is not None and cfg.distributed.strategy != "fsdp2" else 4


def _decode_copy_released(cfg, shape: ModelShape) -> int:
    """What of the decode copy the engine frees for the update (rlft.rollout.base.RolloutEngine.release_memory):
    the Linears an optimizer step rewrites. Under LoRA on every Linear that is all but the LM head (a LoRA on
    some Linears is taken to free nothing: a fused q/k/v with one frozen part stays whole)."""
    lora = cfg.model.lora
    if lora is None:
        return 2 * shape.linear_params
    return 2 * (shape.linear_params - shape.vocab * shape.hidden) if lora.target_modules == "all-linear" else 0


def separate_critic(algorithm) -> bool:
    """Whether a run of ``algorithm`` (an AlgorithmConfig, or None for a job without one) trains a
    critic model of its own: its advantage estimator needs values (the registry's trait) and
    ``algorithm.critic.type`` is ``separate``, not a value head on the policy."""
    if algorithm is None:
        return False
    from rlft.algorithms import ADVANTAGES

    return bool(ADVANTAGES.trait(algorithm.advantage_estimator, "needs_values")) and algorithm.critic.type == "separate"


def _critic_kept(cfg, shape: ModelShape) -> dict[str, int]:
    """A separate critic: its fp32 weights and AdamW moments (the policy's size: its backbone
    defaults to the policy's model)."""
    return {"critic": 12 * shape.params} if separate_critic(cfg.algorithm) else {}


def _eval_geometry(cfg, default_new: int) -> dict[str, int]:
    """The evaluation's generation batch, or nothing when the run never evaluates."""
    ev = cfg.eval
    has_data = cfg.data.eval_file is not None or cfg.data.eval_split > 0
    if not has_data or not (ev.before_training or ev.after_training or ev.interval):
        return {}
    return {"eval_rows": ev.batch_size, "eval_new_tokens": ev.max_new_tokens or default_new}


def _supervised(
    shape: ModelShape,
    device: DeviceSpec,
    cfg,
    rows: int,
    micro: int,
    length: int,
    compute_bytes: int,
    reference: bool,
    head: bool = True,
) -> tuple[Geometry, Phases]:
    """A job that only updates (SFT, reward models, DPO) on rows of up to ``length`` tokens."""
    lora = cfg.model.lora is not None
    recompute = _recompute(cfg.model.gradient_checkpointing, device)
    g = Geometry(
        rows=rows,
        prompts=0,
        prompt_tokens=length,
        new_tokens=0,
        micro_rows=micro,
        compute_bytes=compute_bytes,
        recompute=recompute,
        device_kind=device.kind,
    )
    kept = {
        **trained_bytes(shape, _frozen_linear_bytes(cfg, compute_bytes)),
        "reference": reference_bytes(shape, compute_bytes, lora) if reference else 0,
    }
    one_pass = micro >= rows and device.kind == "cuda"  # see update_bytes
    phases: Phases = {"update": {**kept, **update_bytes(shape, g, head=head, one_pass=one_pass)}}
    if reference:
        phases["scoring"] = {**kept, **scoring_bytes(shape, g)}
    return g, phases


def sft_phases(cfg, shape, device, prompt_tokens, compute_bytes):
    """Updates on rows of up to ``data.max_length`` tokens (packed rows are exactly that long)."""
    s = cfg.sft
    return _supervised(shape, device, cfg, s.batch_size, s.micro_batch_size, cfg.data.max_length, compute_bytes, False)


def rm_phases(cfg, shape, device, prompt_tokens, compute_bytes):
    """Both sides of each pair in one forward, scored by a one-output head (no vocabulary logits)."""
    r = cfg.rm
    return _supervised(
        shape,
        device,
        cfg,
        2 * r.batch_size,
        2 * r.micro_batch_size,
        cfg.data.max_length,
        compute_bytes,
        False,
        head=False,
    )


def dpo_phases(cfg, shape, device, prompt_tokens, compute_bytes):
    """Both sides of each pair, under the policy and (once per micro-batch) the reference."""
    d = cfg.dpo
    return _supervised(
        shape, device, cfg, 2 * d.batch_size, 2 * d.micro_batch_size, cfg.data.max_length, compute_bytes, True
    )
