"""Generation engines behind one interface (:class:`RolloutEngine`)."""

from rlft.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from rlft.rollout.hf_engine import HFGenerateEngine

__all__ = ["HFGenerateEngine", "RolloutBatch", "RolloutEngine", "SamplingParams"]
