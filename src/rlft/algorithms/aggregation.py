"""Masked reductions of per-token values to one scalar.

Every mode takes explicit global normalisers so that a rollout batch split into
micro-batches gives exactly the same total loss as the unsplit batch: the
trainer passes the counts of the *whole* batch and sums micro-batch results.
"""

from __future__ import annotations

import torch

from rlft.algorithms.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1. ``values``, ``mask``: same shape. Empty -> 0."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


@AGGREGATIONS.register("token_mean")
def token_mean(
    values: torch.Tensor, mask: torch.Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> torch.Tensor:
    """Sum of all valid token values / number of valid tokens in the whole batch.

    values, mask: [B, T]. Long sequences weigh more (DAPO's token-level loss).
    """
    return (values * mask).sum() / max(num_tokens, 1.0)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    values: torch.Tensor, mask: torch.Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> torch.Tensor:
    """Mean over tokens within each sequence, then mean over the batch's sequences (the GRPO paper).

    values, mask: [B, T]. Each sequence weighs the same whatever its length.
    """
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(num_seqs, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, *, num_tokens: float, num_seqs: float, max_len: int
) -> torch.Tensor:
    """Token sums divided by a fixed length (max_len), then mean over sequences (Dr. GRPO).

    values, mask: [B, T]. Removes the length bias of per-sequence normalisation.
    """
    per_seq = (values * mask).sum(-1) / float(max(max_len, 1))
    return per_seq.sum() / max(num_seqs, 1.0)


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, *, num_tokens: float, num_seqs: float, max_len: int
) -> torch.Tensor:
    """Reduce ``values`` [B, T] under ``mask`` [B, T] with the named mode (see AGGREGATIONS)."""
    fn = AGGREGATIONS.get(mode)
    return fn(values, mask.to(values.dtype), num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
