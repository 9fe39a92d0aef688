"""Pure torch maths of RL fine-tuning: advantages, policy losses, KL, aggregation.

Nothing here touches a model, a config object or the file system.  Each kind of
piece lives in one name -> function registry.
"""

from rlft.algorithms.advantages import ADVANTAGES, AdvantageInputs, compute_advantages
from rlft.algorithms.aggregation import AGGREGATIONS, aggregate, masked_mean
from rlft.algorithms.kl import KL_ESTIMATORS, kl_penalty
from rlft.algorithms.losses import POLICY_LOSSES, PolicyLossTerms, policy_loss
from rlft.algorithms.objective import ObjectiveOutput, policy_objective

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "ObjectiveOutput",
    "PolicyLossTerms",
    "aggregate",
    "compute_advantages",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "policy_objective",
]
