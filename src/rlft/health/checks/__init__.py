"""Every health check, registered by name in :data:`CHECKS` (importing this package fills it).

One module per concern: the learning signal and what the policy writes (:mod:`.learning`), the
numbers of the update (:mod:`.stability`), tools and environments (:mod:`.environment`), and the
held-out evaluation (:mod:`.heldout`)."""

from rlft.health.checks import environment, heldout, learning, stability  # noqa: F401  (they register)
from rlft.health.checks.base import CHECKS, Check, register

__all__ = ["CHECKS", "Check", "register"]
