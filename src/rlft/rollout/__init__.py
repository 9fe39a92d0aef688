"""Generation engines behind one interface (:class:`RolloutEngine`), looked up by name."""

from rlft.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from rlft.rollout.hf_engine import HFGenerateEngine
from rlft.rollout.native_engine import NativeEngine

ENGINES = {"native": NativeEngine, "hf": HFGenerateEngine}

__all__ = ["ENGINES", "HFGenerateEngine", "NativeEngine", "RolloutBatch", "RolloutEngine", "SamplingParams"]
