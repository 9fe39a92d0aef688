"""The models a run's rewards load into its own process, and the memory they take on the run's device.

A reward model (``type: model``, :mod:`rlft.rewards.model_reward`; its Linear weights in bf16 where its
``dtype`` says so) and a local judge (``type: judge`` with ``model``, :mod:`rlft.rewards.judge`; likewise) each
keep their weights from the first step to the last, beside the policy, and while they score, one batch's
forward: a reward model's ``batch_size`` sequences, a judge's generation over its batch of rubric prompts. One
on another device (``device: cpu`` beside a GPU run) takes nothing from the run's.
"""

from __future__ import annotations

from rlft.config.sections import ModelConfig
from rlft.errors import RlftError
from rlft.planner.devices import dtype_bytes
from rlft.planner.phases import DECODE_LOGIT_COPIES, forward_bytes, kv_bytes
from rlft.planner.shape import ModelShape, model_shape

JUDGE_BATCH = 8  # rlft.rewards.judge._local: questions per generate call
RUBRIC_TOKENS = 128  # a rubric's own words around the prompt and the completion, rounded up


def scorer_bytes(cfg, device_kind: str, seq: int) -> tuple[int, int]:
    """(the weights every scorer on a device of ``device_kind`` (``cpu``, ``cuda``) keeps, the largest one's
    scoring batch) in bytes, for a run whose prompt and completion take up to ``seq`` tokens. A scorer whose
    config cannot be read counts nothing: loading it reports why, naming the reward."""
    kept = work = 0
    for spec in cfg.reward.functions:
        path = spec.path if spec.type == "model" else spec.model if spec.type == "judge" else None
        if path is None or not _on(spec.device, device_kind):
            continue
        try:
            shape = model_shape(ModelConfig(path=str(path)))
        except (RlftError, OSError, ValueError, KeyError):
            continue
        compute = dtype_bytes(spec.dtype, device_kind)
        if spec.type == "model":
            kept += _stored_bytes(shape, compute, classifier=True)
            work = max(work, forward_bytes(shape, spec.batch_size * min(seq, spec.max_length), 4))
        else:
            kept += _stored_bytes(shape, compute, classifier=False)
            tokens = RUBRIC_TOKENS + seq * (cfg.algorithm.num_generations if spec.mode == "group" else 1)
            work = max(
                work,
                kv_bytes(shape, JUDGE_BATCH, tokens + spec.max_new_tokens, compute)
                + forward_bytes(shape, JUDGE_BATCH * tokens, 4)
                + DECODE_LOGIT_COPIES * 4 * JUDGE_BATCH * shape.vocab,
            )
    return kept, work


def _stored_bytes(shape: ModelShape, linear_bytes: int, classifier: bool) -> int:
    """A scorer's weights: its Linear weights in ``linear_bytes`` each (:func:`rlft.models.precision.place_weights`)
    and the rest in fp32. A ``classifier`` (a reward model) has a one-output score head in place of its causal LM's
    head (which, tied to the embedding, was counted once as it)."""
    swapped = (0 if shape.tied_embeddings else shape.vocab * shape.hidden) - shape.hidden if classifier else 0
    linear = shape.untied_linear_params - swapped
    return linear_bytes * linear + 4 * (shape.params - swapped - linear)


def _on(where: str, device_kind: str) -> bool:
    """Whether a scorer placed at ``where`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) shares the run's device:
    ``auto`` is the GPU where the run has one, as the run's own ``auto``."""
    return where == "auto" or where.partition(":")[0] == device_kind
