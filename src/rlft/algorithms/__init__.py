"""Pure torch maths of fine-tuning: advantages, policy losses, KL, aggregation, critic losses, the SFT loss,
the Bradley-Terry loss of reward models.

Nothing here touches a model, a config object or the file system.  Each kind of
piece lives in one name -> function registry; ``presets`` says which pieces and
defaults each ``algorithm.name`` selects.
"""

from rlft.algorithms.advantages import ADVANTAGES, AdvantageInputs, Advantages, compute_advantages
from rlft.algorithms.aggregation import AGGREGATIONS, aggregate, masked_mean
from rlft.algorithms.importance import ImportanceWeights, logprob_mismatch, truncated_importance_weights
from rlft.algorithms.kl import KL_ESTIMATORS, adaptive_kl_coef, kl_penalty
from rlft.algorithms.losses import POLICY_LOSSES, PolicyLossTerms, policy_loss
from rlft.algorithms.objective import ObjectiveOutput, policy_objective
from rlft.algorithms.preference import DPO_LOSSES, DPOStats, PairStats, bradley_terry_loss, dpo_loss
from rlft.algorithms.sft import sft_loss
from rlft.algorithms.shaping import groups_with_signal, overlong_penalty
from rlft.algorithms.value import VALUE_LOSSES, explained_variance

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "VALUE_LOSSES",
    "AdvantageInputs",
    "Advantages",
    "DPOStats",
    "ImportanceWeights",
    "ObjectiveOutput",
    "PairStats",
    "PolicyLossTerms",
    "adaptive_kl_coef",
    "aggregate",
    "bradley_terry_loss",
    "compute_advantages",
    "dpo_loss",
    "DPO_LOSSES",
    "explained_variance",
    "groups_with_signal",
    "kl_penalty",
    "logprob_mismatch",
    "masked_mean",
    "overlong_penalty",
    "policy_loss",
    "policy_objective",
    "sft_loss",
    "truncated_importance_weights",
]
