"""Generation engines behind one interface (:class:`RolloutEngine`), looked up by name."""

from rlft.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from rlft.rollout.hf_engine import HFGenerateEngine
from rlft.rollout.native_engine import NativeEngine
from rlft.rollout.vllm_engine import VLLMEngine  # imports vllm only when one is built

ENGINES = {"native": NativeEngine, "hf": HFGenerateEngine, "vllm": VLLMEngine}

__all__ = [
    "ENGINES",
    "HFGenerateEngine",
    "NativeEngine",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "VLLMEngine",
]
