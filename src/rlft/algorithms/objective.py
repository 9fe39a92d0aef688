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
from rlft.algorithms.importance import logprob_mismatch, truncated_importance_weights
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
    rollout_logprobs: torch.Tensor | None = None,
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
    ``rollout_logprobs`` [B, T]: the engine's sampling log-probs, when it reported them; then
    ``rollout/logprob_mismatch`` is the mean |old_logprobs - rollout_logprobs| over the computed loss
    tokens, and with ``loss_params['tis_cap']`` set (``algorithm.tis_cap``) each token's
    policy-gradient loss is weighted by the truncated importance weight
    min(exp(old_logprobs - rollout_logprobs), tis_cap) (:mod:`rlft.algorithms.importance`), with
    ``rollout/tis_clip_frac`` the share of those tokens the cap cut.
    """
    mask = mask.to(logprobs.dtype)
    terms = policy_loss(loss_name, logprobs, old_logprobs, advantages, mask, **loss_params)
    counts: dict[str, Any] = dict(num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    token_share = 1.0 / max(num_tokens if num_computed_tokens is None else num_computed_tokens, 1.0)
    per_token, stats = _importance_weighted(
        terms.per_token_loss, old_logprobs, rollout_logprobs, mask, loss_params.get("tis_cap"), token_share
    )
    stats.update(
        {
            "pg_loss": aggregate(per_token.detach(), mask, aggregation, **counts).item(),
            "clip_frac": ((terms.clipped * mask).sum() * token_share).item(),
            "ratio/mean": ((terms.ratio * mask).sum() * token_share).item(),
        }
    )
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        stats["kl"] = ((kl.detach() * mask).sum() * token_share).item()
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, aggregation, **counts)
    stats["loss"] = loss.detach().item()
    return ObjectiveOutput(loss=loss, stats=stats)


def _importance_weighted(
    per_token: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    tis_cap: float | None,
    token_share: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy-gradient loss [B, T], TIS-weighted when ``tis_cap`` is set and there are rollout
    log-probs, and the engine-vs-trainer statistics (none without rollout log-probs)."""
    if rollout_logprobs is None:
        return per_token, {}
    stats = {
        "rollout/logprob_mismatch": (logprob_mismatch(old_logprobs, rollout_logprobs, mask).sum() * token_share).item()
    }
    if tis_cap is not None:
        tis = truncated_importance_weights(old_logprobs, rollout_logprobs, mask, tis_cap)
        per_token = per_token * tis.weights.to(per_token.dtype)
        stats["rollout/tis_clip_frac"] = (tis.truncated.sum() * token_share).item()
    return per_token, stats
