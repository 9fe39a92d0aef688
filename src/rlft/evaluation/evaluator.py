"""Held-out evaluation: generate for every eval prompt, score with the run's rewards."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rlft.rollout.base import RolloutEngine, SamplingParams


@dataclass
class EvalResult:
    """accuracy: share of prompts whose ``accuracy_reward`` >= threshold; rewards: mean of each reward."""

    accuracy: float
    reward_mean: float
    rewards: dict[str, float]
    num_prompts: int
    completion_length_mean: float
    truncation_rate: float
    seconds: float
    samples: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "samples"}


def columns_of(examples) -> dict[str, list]:
    """Row columns as aligned lists (TRL's ``**columns`` convention); missing values become None."""
    keys: list[str] = []
    for ex in examples:
        keys.extend(k for k in ex.columns if k not in keys)
    return {k: [ex.columns.get(k) for ex in examples] for k in keys}


def evaluate(engine: RolloutEngine, examples, reward_manager, *, max_new_tokens: int, batch_size: int,
             accuracy_reward: str, success_threshold: float, greedy: bool = True) -> EvalResult:
    """One completion per prompt (greedy by default) scored by every reward."""
    start = time.perf_counter()
    sampling = SamplingParams(max_new_tokens=max_new_tokens, n=1, greedy=greedy)
    per_reward: dict[str, list[float]] = {}
    totals: list[float] = []
    lengths: list[int] = []
    truncated = 0
    samples = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        rollout = engine.generate([ex.text for ex in chunk], sampling)
        scored = reward_manager.score([ex.prompt for ex in chunk], rollout.texts, columns_of(chunk))
        totals.extend(scored.total.tolist())
        for name, values in scored.per_reward.items():
            per_reward.setdefault(name, []).extend(values.tolist())
        lengths.extend(rollout.completion_lengths.tolist())
        truncated += sum(r == "length" for r in rollout.finish_reasons)
        for j, ex in enumerate(chunk):
            samples.append({"source": ex.source, "prompt": ex.prompt, "completion": rollout.texts[j],
                            "rewards": {n: v[i + j] for n, v in per_reward.items()}})
    n = max(len(totals), 1)
    correct = sum(v >= success_threshold for v in per_reward[accuracy_reward])
    return EvalResult(
        accuracy=correct / n,
        reward_mean=sum(totals) / n,
        rewards={name: sum(v) / n for name, v in per_reward.items()},
        num_prompts=len(totals),
        completion_length_mean=sum(lengths) / n,
        truncation_rate=truncated / n,
        seconds=time.perf_counter() - start,
        samples=samples,
    )
