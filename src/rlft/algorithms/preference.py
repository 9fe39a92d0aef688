"""Preference objectives: the Bradley-Terry loss of reward-model training and the DPO losses."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlft.algorithms.registry import Registry

# name -> per-pair DPO loss [B] from h [B], the policy's log-ratio margin over the reference's
# (see :func:`dpo_loss`); config.preference's ``dpo.loss`` names one.
DPO_LOSSES: Registry = Registry("DPO loss")


@dataclass
class PairStats:
    """Detached per-batch statistics: accuracy (share of pairs with r_chosen > r_rejected), the mean
    margin r_chosen - r_rejected, and the mean chosen / rejected scores."""

    accuracy: float
    margin: float
    chosen: float
    rejected: float


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    *,
    margin: torch.Tensor | float = 0.0,
    num_pairs: float | None = None,
    center_coef: float = 0.0,
) -> tuple[torch.Tensor, PairStats]:
    """-log sigmoid(r_c - r_r - m), summed over the pairs and divided by ``num_pairs``.

    chosen, rejected: [B] scalar scores of each pair's two responses; margin: [B] or a constant
    (Touvron et al. 2023's margin: a pair labelled "much better" must be separated by at least m);
    num_pairs: the pairs of the whole optimizer batch (default B), so micro-batch losses add up to
    the batch mean and any split gives the same gradient. ``center_coef`` adds
    coef * (r_c + r_r)^2 per pair (Eisenstein et al. 2023's centring), which pins the free offset of
    the scores (Bradley-Terry sees only their differences) near 0.

    Departs from the paper (Bradley & Terry 1952; as used by Ouyang et al. 2022) only in that the
    K-choose-2 comparisons of one prompt are independent rows here, not one batch element.
    """
    diff = chosen.float() - rejected.float()
    per_pair = -F.logsigmoid(diff - margin)
    if center_coef:
        per_pair = per_pair + center_coef * (chosen.float() + rejected.float()) ** 2
    loss = per_pair.sum() / (num_pairs if num_pairs is not None else max(diff.numel(), 1))
    with torch.no_grad():
        stats = PairStats(
            accuracy=float((diff > 0).float().mean()),
            margin=float(diff.mean()),
            chosen=float(chosen.float().mean()),
            rejected=float(rejected.float().mean()),
        )
    return loss, stats


@dataclass
class DPOStats:
    """Detached: accuracy (share of pairs whose implicit reward prefers chosen), the mean implicit
    rewards beta * (log pi - log pi_ref) of chosen and rejected, and their mean margin."""

    accuracy: float
    chosen: float
    rejected: float
    margin: float


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float,
    loss: str = "sigmoid",
    label_smoothing: float = 0.0,
    num_pairs: float | None = None,
) -> tuple[torch.Tensor, DPOStats]:
    """The DPO objective on sequence log-probabilities [B] (sums over each response's tokens) under
    the policy and the frozen reference; summed over pairs and divided by ``num_pairs`` (default B)
    so micro-batches add up to the batch mean.

    h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r));
    ``sigmoid``: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)  (Rafailov et al. 2023; eps
    is cDPO's label smoothing); ``ipo``: (h - 1 / (2 beta))^2  (Azar et al. 2023).

    Departs from TRL's IPO, which averages log-probs over tokens: here both losses use the sums, as
    both papers define them.
    """
    h = (policy_chosen.float() - ref_chosen.float()) - (policy_rejected.float() - ref_rejected.float())
    per_pair = DPO_LOSSES.call(loss, h, beta=beta, label_smoothing=label_smoothing)
    value = per_pair.sum() / (num_pairs if num_pairs is not None else max(h.numel(), 1))
    with torch.no_grad():
        chosen = beta * (policy_chosen.float() - ref_chosen.float())
        rejected = beta * (policy_rejected.float() - ref_rejected.float())
        stats = DPOStats(
            accuracy=float((chosen > rejected).float().mean()),
            chosen=float(chosen.mean()),
            rejected=float(rejected.mean()),
            margin=float((chosen - rejected).mean()),
        )
    return value, stats


@DPO_LOSSES.register("sigmoid")
def sigmoid_dpo(h: torch.Tensor, *, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) per pair [B] (Rafailov et al. 2023;
    eps is cDPO's label smoothing, 0 for plain DPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


@DPO_LOSSES.register("ipo")
def ipo(h: torch.Tensor, *, beta: float) -> torch.Tensor:
    """(h - 1 / (2 beta))^2 per pair [B] (Azar et al. 2023), on summed log-probs as the paper defines it."""
    return (h - 1 / (2 * beta)) ** 2
