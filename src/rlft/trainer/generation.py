"""The generation evaluation every kind of job shares: the engine, and ``eval.*`` unpacked for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlft.config.schema import RunConfig
from rlft.evaluation import EvalResult, evaluate


@dataclass(frozen=True)
class GenerationSettings:
    """How a kind of job generates for its evaluation: the rollout engine (a name in
    ``rlft.rollout.ENGINES``), prompt truncation, the token budget, and whether the tokenizer adds
    its special tokens (not when the chat template already did); ``episodes`` wraps the engine into a
    multi-turn episode runner (None: one completion per prompt); ``decode_copy``: generate from a copy of
    the weights in the compute dtype (training jobs that decode every step); ``engine_options``: the
    chosen engine's own keyword arguments (``RolloutConfig.engine_options``: vLLM's memory share)."""

    engine: str
    max_prompt_length: int
    max_new_tokens: int
    add_special_tokens: bool
    episodes: Callable | None = None
    decode_copy: bool = False
    fused_decode: bool = True
    engine_options: dict = field(default_factory=dict)

    def make_engine(self, model, tokenizer, autocast_dtype: torch.dtype | None):
        from rlft.rollout import ENGINES

        engine = ENGINES[self.engine](
            model,
            tokenizer,
            max_prompt_length=self.max_prompt_length,
            autocast_dtype=autocast_dtype,
            add_special_tokens=self.add_special_tokens,
            decode_copy=self.decode_copy,
            fused_decode=self.fused_decode,
            **self.engine_options,
        )
        return self.episodes(engine) if self.episodes is not None else engine


def evaluate_generations(engine, examples: list, rewards, cfg: RunConfig, max_new_tokens: int) -> EvalResult:
    """:func:`rlft.evaluation.evaluate` with the run's ``eval.*`` settings, on its own random stream
    seeded with ``train.seed`` (so evaluating never changes the training trajectory)."""
    ecfg = cfg.eval
    examples = examples[: ecfg.max_samples] if ecfg.max_samples else examples
    return evaluate(
        engine,
        examples,
        rewards,
        max_new_tokens=max_new_tokens,
        batch_size=ecfg.batch_size,
        accuracy_reward=ecfg.accuracy_reward or rewards.names[0],
        success_threshold=ecfg.success_threshold,
        num_samples=ecfg.num_samples,
        temperature=ecfg.temperature,
        pass_k=ecfg.pass_k,
        seed=cfg.train.seed,
    )
