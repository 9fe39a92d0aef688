"""What the RL job does differently when it is one of several processes (``torchrun``).

The loop itself is the same at any world size; these functions are the seams:
:func:`spread_over_processes` applies ``distributed.strategy`` to the built model,
:func:`refresh_replica` keeps the rollout's whole copy of the weights current under fsdp2, and
the two metric functions make every logged number describe the global batch, as a single
process computing the same step would log it.
"""

from __future__ import annotations

import copy

import torch

from rlft.distributed.context import Dist
from rlft.distributed.strategy import strategy_of
from rlft.errors import UsageError
from rlft.rl.metrics import rollout_metrics
from rlft.speed.clock import is_timing
from rlft.trainer.parts import ModelParts


def spread_over_processes(parts: ModelParts, dist: Dist) -> torch.nn.Module | None:
    """Apply the strategy to the policy (and the reference) in place.

    Returns the rollout's replica under fsdp2: a plain copy of the whole policy, taken before
    sharding, that generation reads (decoding from the sharded module would all-gather every
    layer at every decoded token). None otherwise: the rollout reads the policy itself."""
    if not dist.enabled:
        return None
    strategy, replica = strategy_of(dist), None
    if strategy.shards:
        if hasattr(parts.model, "peft_config"):
            raise UsageError(
                "distributed.strategy: fsdp2 with model.lora: a LoRA run's trained state is small; "
                "use distributed.strategy: ddp (the frozen base is replicated, the adapter's "
                "gradients summed)"
            )
        replica = copy.deepcopy(parts.model).requires_grad_(False).eval()
        if parts.reference is not None and not parts.reference.shares_weights:
            strategy.shard_frozen(parts.reference.module, dist)
    strategy.shard_model(parts.model, dist)
    return replica


@torch.no_grad()
def refresh_replica(replica: torch.nn.Module | None, model: torch.nn.Module, dist: Dist) -> None:
    """Copy the policy's updated weights into the rollout's replica: one all-gather per optimizer step."""
    if replica is None:
        return
    state = strategy_of(dist).full_state_for_rollout(model, dist)
    assert state is not None, "a replica exists only under fsdp2, which gathers the full state"
    replica.load_state_dict(state, strict=False)


SUMMED = ("work/",)  # counts of work done (tokens prefilled, decoded ...): the run's is the processes' sum


def _summed(metric: str) -> bool:
    """A work counter, not a duration among them (``work/decode_capture_seconds`` is each process's own time)."""
    return metric.startswith(SUMMED) and not is_timing(metric)


def mean_over_processes(metrics: dict[str, float], dist: Dist) -> dict[str, float]:
    """Each metric averaged over the processes (their shares of the batch are equal), the work
    counters summed. The update's statistics are already global (summed with global normalisers),
    so averaging leaves them as they are; timings become the mean process's."""
    if not dist.enabled:
        return metrics
    sums, present = dist.sum_by_key(metrics)
    return {k: s if _summed(k) else s / max(present[k], 1.0) for k, s in sums.items()}


def global_rollout_metrics(
    scored, rollout, group_size: int, weights: dict[str, float], dist: Dist, valid: torch.Tensor | None = None
) -> dict:
    """Reward, length and finish statistics (:func:`rlft.rl.metrics.rollout_metrics`) of the whole
    step's batch: every process's rows, gathered in rank order (the single-process order). ``valid``
    [N] bool (this process's rows) or None: the rows the reward statistics count."""
    total, per_reward, lengths = scored.total, scored.per_reward, rollout.completion_lengths
    reasons, texts = rollout.finish_reasons, rollout.texts
    if dist.enabled:
        mine = torch.ones(len(total), dtype=torch.bool) if valid is None else valid.cpu()
        parts = dist.gather_objects(
            (total.cpu(), {k: v.cpu() for k, v in per_reward.items()}, lengths.cpu(), reasons, texts, mine)
        )
        total = torch.cat([p[0] for p in parts])
        per_reward = {k: torch.cat([p[1][k] for p in parts]) for k in per_reward}
        lengths = torch.cat([p[2] for p in parts])
        reasons = [r for p in parts for r in p[3]]
        texts = [t for p in parts for t in p[4]]
        valid = None if all(bool(p[5].all()) for p in parts) else torch.cat([p[5] for p in parts])
    return rollout_metrics(total, per_reward, lengths, reasons, group_size, texts=texts, weights=weights, valid=valid)
