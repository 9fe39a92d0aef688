"""The per-micro-batch policy objective: policy loss + KL penalty, aggregated.

Pure tensor maths: the trainer passes tensors and plain scalars.  Statistics are
normalised by the *global* batch counts so that summing them over
micro-batches yields the batch value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlft.algorithms.aggregation import aggregate
from rlft.algorithms.kl import kl_penalty
from rlft.algorithms.losses import policy_loss


@dataclass
class ObjectiveOutput:
    """loss: scalar with grad; stats: detached floats, additive over micro-batches."""

    loss: torch.Tensor
    stats: dict[str, float]


def policy_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    *,
    loss_name: str,
    loss_params: dict[str, Any],
    kl_coef: float,
    kl_estimator: str,
    aggregation: str,
    num_tokens: float,
    num_seqs: float,
    max_len: int,
    num_computed_tokens: float | None = None,
) -> ObjectiveOutput:
    """aggregate(policy_loss + kl_coef * KL) over completion tokens.

    logprobs (with grad), old_logprobs, advantages, mask, ref_logprobs: [B, T].
    ``loss_params`` is a pool of hyper-parameters; the named loss takes those it declares.
    ``ref_logprobs`` None means no KL term in the loss (none at all, or KL placed in the reward).
    ``num_tokens``/``num_seqs`` count the whole optimizer batch, not just this
    micro-batch; ``max_len`` is the fixed normaliser of seq_mean_token_sum_norm.
    ``num_computed_tokens`` counts the tokens of the rows the optimizer step actually computes
    (rows whose loss is exactly zero may be skipped): the monitoring means ``ratio/mean``,
    ``clip_frac`` and ``kl`` average over those, so an on-policy ratio reads 1.0 however many
    rows were skipped. Default: ``num_tokens``.
    """
    mask = mask.to(logprobs.dtype)
    terms = policy_loss(loss_name, logprobs, old_logprobs, advantages, mask, **loss_params)
    per_token = terms.per_token_loss
    counts = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    token_share = 1.0 / max(num_tokens if num_computed_tokens is None else num_computed_tokens, 1.0)
    stats = {
        "pg_loss": aggregate(per_token.detach(), mask, aggregation, **counts).item(),
        "clip_frac": ((terms.clipped * mask).sum() * token_share).item(),
        "ratio/mean": ((terms.ratio * mask).sum() * token_share).item(),
    }
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        stats["kl"] = ((kl.detach() * mask).sum() * token_share).item()
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, aggregation, **counts)
    stats["loss"] = loss.detach().item()
    return ObjectiveOutput(loss=loss, stats=stats)
