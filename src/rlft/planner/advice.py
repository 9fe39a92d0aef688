"""What to turn down when a run does not fit: the knobs in order of least cost, each with the
predicted peak once it (and every knob before it) is applied.

The order puts first what leaves the training mathematically the same and only costs time (a
smaller micro-batch, gradient checkpointing, decoding without the bf16 copy, a reward model or a
judge on the CPU), then the numerics (bf16), then what changes what is trained (LoRA), and last
what changes the data a step sees (fewer prompts per step, shorter completions and prompts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from rlft.planner.estimate import MemoryEstimate, estimate_memory
from rlft.planner.shape import ModelShape, model_shape


@dataclass(frozen=True)
class Knob:
    """One change: ``setting`` as ``--set`` takes it, what it costs, and the peak predicted after it."""

    setting: str
    cost: str
    peak: int


def _get(cfg, path: str):
    obj = cfg
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


def _micro_path(cfg) -> str | None:
    """The config path of the rows per forward/backward (``algorithm.``, ``sft.``, ``dpo.`` ...)."""
    for name in type(cfg).model_fields:
        if hasattr(getattr(cfg, name), "micro_batch_size"):
            return f"{name}.micro_batch_size"
    return None


# recomputing more than the run does (rlft.models.checkpointing): selectively, then every layer
_DEEPER_RECOMPUTE: dict[str, tuple] = {"off": ("selective", True), "selective": (True,), "full": ()}
_RECOMPUTE_COST = {
    "selective": "the update recomputes its elementwise work (norms, activations, casts) and keeps the matmuls' "
    "outputs: under half the activation memory, a few per cent slower, the same gradients",
    True: "the update recomputes every layer's forward: about 30 % slower, the same gradients",
}


_SCORER = {"model": "reward model", "judge": "judge"}  # the rewards that load a model (rlft.planner.scorers)


def _decode_copy_knob(cfg, est: MemoryEstimate) -> list[tuple[str, object, str]]:
    """``rollout.decode_copy: false`` where the run decodes from a bf16 copy, with what it costs."""
    rollout = getattr(cfg, "rollout", None)
    if rollout is None or est.geometry.compute_bytes != 2 or not rollout.decode_copy:
        return []
    cost = (
        "no bf16 copy of the weights for decoding: a slower rollout"
        if cfg.model.lora is None
        else "the adapters applied unmerged while decoding, no merged copy of the base: a small product more in "
        "every decode matmul"
    )
    return [("rollout.decode_copy", False, cost)]


def _candidates(cfg, est: MemoryEstimate) -> list[tuple[str, object, str]]:
    """(dotted path, new value, cost) for each knob that applies to ``cfg`` now, least costly first."""
    out: list[tuple[str, object, str]] = []
    micro_path = _micro_path(cfg)
    micro = _get(cfg, micro_path) if micro_path else None
    if isinstance(micro, int) and micro > 1:
        out.append(
            (
                micro_path,
                max(1, micro // 2),
                "more, smaller forward/backward passes: a slower update, the same gradients",
            )
        )
    deeper = _DEEPER_RECOMPUTE[est.geometry.recompute]
    out += [("model.gradient_checkpointing", setting, _RECOMPUTE_COST[setting]) for setting in deeper]
    out += _decode_copy_knob(cfg, est)
    reward = getattr(cfg, "reward", None)
    if reward is not None and est.device.kind == "cuda":
        out += [
            (f"reward.functions.{i}.device", "cpu", f"the {_SCORER[spec.type]} runs on the CPU: slower rewards")
            for i, spec in enumerate(reward.functions)
            if (spec.type == "model" or (spec.type == "judge" and spec.model is not None)) and spec.device != "cpu"
        ]
    if est.geometry.compute_bytes == 4:
        out.append(("model.dtype", "bf16", "bf16 compute (fp32 master weights): slightly different numerics"))
    if cfg.model.lora is None:
        out.append(
            (
                "model.lora",
                {"r": 16},
                "trains a rank-16 adapter instead of every weight; the reference model is then free",
            )
        )
    if est.geometry.new_tokens:  # a job that generates: fewer, shorter samples
        alg = cfg.algorithm
        if alg.rollout_batch_size > 1:
            out.append(
                (
                    "algorithm.rollout_batch_size",
                    max(1, alg.rollout_batch_size // 2),
                    "fewer prompts per step: noisier steps, more of them per epoch",
                )
            )
        if alg.max_new_tokens > 16 and cfg.environment is None:
            out.append(("algorithm.max_new_tokens", alg.max_new_tokens // 2, "completions are cut at half the length"))
        if cfg.data.max_prompt_length > est.geometry.prompt_tokens:
            out.append(
                (
                    "data.max_prompt_length",
                    est.geometry.prompt_tokens,
                    "no cost: the longest prompt in the data is this long",
                )
            )
    elif hasattr(cfg.data, "max_length") and cfg.data.max_length > 64:
        out.append(("data.max_length", cfg.data.max_length // 2, "longer rows are cut or dropped"))
    return out


def advise(cfg, est: MemoryEstimate, reestimate: Callable | None = None, max_knobs: int = 8) -> list[Knob]:
    """Knobs to apply in order until the run fits (all that apply if none is enough); empty when it
    fits already. ``reestimate(cfg) -> MemoryEstimate`` (default: on the same device and data)."""
    if reestimate is None:
        shapes: dict[str, ModelShape] = {}  # each other model the knobs try (a LoRA), built once

        def reestimate(changed):
            if (changed.model.lora is None) == (cfg.model.lora is None):
                shape = est.shape
            elif (shape := shapes.get(key := changed.model.model_dump_json())) is None:
                shape = shapes[key] = model_shape(changed.model)
            return estimate_memory(
                changed,
                est.device,
                shape=shape,
                prompt_tokens=est.geometry.prompt_tokens,
                processes=est.processes,
                sharded=est.sharded,
            )

    changes: dict[str, tuple[object, str]] = {}  # path -> (value, cost), in the order first chosen
    current, now = cfg, est
    for _ in range(4 * max_knobs):  # halving the same knob again counts as one knob
        if now.fits or len(changes) > max_knobs:
            break
        found = _lowering_knob(current, now, reestimate)
        if found is None:
            break
        path, value, cost, current, now = found
        changes[path] = (value, changes.get(path, (None, cost))[1])
    # each knob at its final value, in the order chosen, each peak with the knobs above it applied
    knobs: list[Knob] = []
    current = cfg
    for path, (value, cost) in changes.items():
        current = _with(current, path, value)
        after = reestimate(current)
        knobs.append(Knob(f"{path}={_show(value)}", cost, after.peak))
        if after.fits:  # at final values an earlier knob may already be enough
            break
    return knobs


def _lowering_knob(cfg, est: MemoryEstimate, reestimate: Callable):
    """The least costly knob that lowers the peak by at least 1 %: (path, value, cost, the changed
    config, its estimate), or None."""
    for path, value, cost in _candidates(cfg, est):
        try:
            changed = _with(cfg, path, value)
        except ValidationError:  # a knob this kind of job does not take (e.g. LoRA for a reward model)
            continue
        after = reestimate(changed)
        if after.peak < 0.99 * est.peak:
            return path, value, cost, changed, after
    return None


def _with(cfg, path: str, value):
    """A copy of ``cfg`` with ``path`` set to ``value`` (validated like a --set)."""
    data = cfg.model_dump()
    node = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]  # reward.functions.0.device
    node[last] = value
    return type(cfg).model_validate(data)


def _show(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)
