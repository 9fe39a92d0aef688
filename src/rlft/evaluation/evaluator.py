"""Held-out evaluation: generate for every eval prompt, score with the run's rewards.

One greedy completion per prompt gives accuracy, mean rewards, length, truncation and
repetition. Optionally ``num_samples`` sampled completions per prompt (at ``temperature``)
give sampled accuracy, the unbiased pass@k and sampled mean rewards.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from rlft.evaluation.metrics import mean, pass_at_k_table, rate, repetition_score
from rlft.rollout.base import RolloutEngine, SamplingParams


@dataclass
class EvalResult:
    """accuracy: share of prompts whose greedy completion has ``accuracy_reward`` >= threshold;
    rewards: mean of each reward over the greedy completions; repetition_mean: mean
    :func:`~rlft.evaluation.metrics.repetition_score` (word trigrams) of the greedy completions.

    With ``num_samples > 0``: sampled_accuracy is the share of all sampled completions that are
    correct, pass_at_k maps k to the mean unbiased pass@k over prompts, sampled_rewards the mean
    of each reward over all samples. Without samples these stay None / empty.
    """

    accuracy: float
    reward_mean: float
    rewards: dict[str, float]
    num_prompts: int
    completion_length_mean: float
    truncation_rate: float
    seconds: float
    samples: list[dict] = field(default_factory=list)
    repetition_mean: float = 0.0
    num_samples: int = 0
    temperature: float | None = None
    sampled_accuracy: float | None = None
    pass_at_k: dict[int, float] = field(default_factory=dict)
    sampled_reward_mean: float | None = None
    sampled_rewards: dict[str, float] = field(default_factory=dict)
    accuracy_reward: str | None = None
    success_threshold: float | None = None
    episodes: dict[str, float] = field(default_factory=dict)

    def metrics_line(self) -> str:
        """The headline numbers in one line (for logs): accuracy, reward, length, repetition, and
        sampled accuracy and pass@k when there are samples."""
        parts = [
            f"accuracy {self.accuracy:.1%} on {self.num_prompts} prompts",
            f"reward {self.reward_mean:.3f}",
            f"len {self.completion_length_mean:.1f}",
            f"truncated {self.truncation_rate:.0%}",
            f"repetition {self.repetition_mean:.2f}",
        ]
        if self.num_samples > 0:
            parts.append(
                f"sampled accuracy {self.sampled_accuracy:.1%} ({self.num_samples}/prompt, T={self.temperature:g})"
            )
            parts += [f"pass@{k} {v:.1%}" for k, v in self.pass_at_k.items()]
        if self.episodes:
            parts.append(
                f"tool use {self.episodes['tool_use_rate']:.0%}, turns {self.episodes['turns_mean']:.2f}, "
                f"tool errors {self.episodes['tool_error_rate']:.0%}"
            )
        return ", ".join(parts)

    def summary(self) -> dict:
        """Every metric (no samples), JSON-serialisable: pass_at_k keys become strings."""
        return {
            "accuracy": self.accuracy,
            "sampled_accuracy": self.sampled_accuracy,
            "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
            "reward_mean": self.reward_mean,
            "rewards": dict(self.rewards),
            "sampled_reward_mean": self.sampled_reward_mean,
            "sampled_rewards": dict(self.sampled_rewards),
            "num_prompts": self.num_prompts,
            "num_samples": self.num_samples,
            "temperature": self.temperature,
            "completion_length_mean": self.completion_length_mean,
            "truncation_rate": self.truncation_rate,
            "repetition_mean": self.repetition_mean,
            "accuracy_reward": self.accuracy_reward,
            "success_threshold": self.success_threshold,
            "episodes": dict(self.episodes),
            "seconds": self.seconds,
        }


def episode_summary(stats: list[dict]) -> dict[str, float]:
    """Means over multi-turn episodes (``EpisodeStats.as_dict()`` each): the share that called a tool at
    all, turns, tool calls, and the share of calls that failed (an error or a timeout)."""
    calls = sum(s["tool_calls"] for s in stats)
    return {
        "tool_use_rate": rate(s["tool_calls"] > 0 for s in stats),
        "turns_mean": mean(s["turns"] for s in stats),
        "tool_calls_mean": mean(s["tool_calls"] for s in stats),
        "tool_error_rate": (sum(s["tool_errors"] + s["tool_timeouts"] for s in stats) / calls) if calls else 0.0,
    }


def columns_of(examples) -> dict[str, list]:
    """Row columns as aligned lists (TRL's ``**columns`` convention); missing values become None."""
    keys: list[str] = []
    for ex in examples:
        keys.extend(k for k in ex.columns if k not in keys)
    return {k: [ex.columns.get(k) for ex in examples] for k in keys}


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Run the block on its own torch random stream seeded with ``seed``, leaving the global one
    untouched (so evaluating during training never changes the training trajectory)."""
    if seed is None:
        yield
        return
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _generate_scored(
    engine: RolloutEngine, examples, reward_manager, sampling: SamplingParams, prompts_per_batch: int
) -> Iterator[tuple]:
    """Per generated row: index of its example, the example, text, finish reason, length (tokens),
    reward values by name, weighted total, and (multi-turn) ``{"episode": stats, "trajectory": messages}``."""
    for i in range(0, len(examples), prompts_per_batch):
        chunk = examples[i : i + prompts_per_batch]
        rollout = engine.run(chunk, sampling)
        rows = [chunk[p] for p in rollout.prompt_index]
        scored = reward_manager.score(
            [ex.prompt for ex in rows], rollout.texts, {**columns_of(rows), **(rollout.columns or {})}
        )
        # NaN: the reward returned None for that sample (it does not apply); JSON reports say null
        per_reward = {
            name: [None if v != v else v for v in values.tolist()] for name, values in scored.per_reward.items()
        }
        totals = scored.total.tolist()
        lengths = rollout.completion_lengths.tolist()
        for r, ex in enumerate(rows):
            episode = (
                {}
                if rollout.episodes is None
                else {"episode": rollout.episodes[r].as_dict(), "trajectory": rollout.columns["trajectories"][r]}
            )
            yield (
                i + rollout.prompt_index[r],
                ex,
                rollout.texts[r],
                rollout.finish_reasons[r],
                int(lengths[r]),
                {name: v[r] for name, v in per_reward.items()},
                totals[r],
                episode,
            )


def _applied_mean(values) -> float:
    """The mean over the samples a reward applied to (None: it returned None for that sample)."""
    return mean(v for v in values if v is not None)


def _checked_pass_k(num_samples: int, pass_k: Sequence[int], accuracy_reward: str, names: list[str]) -> list[int]:
    """The sorted k values of pass@k (none without sampling); ValueError for impossible arguments."""
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0 (got {num_samples})")
    ks = sorted(set(pass_k)) if num_samples > 0 else []
    bad = [k for k in ks if not 1 <= k <= num_samples]
    if bad:
        raise ValueError(f"pass_k values {bad} are not between 1 and num_samples={num_samples}")
    if accuracy_reward not in names:
        raise ValueError(f"accuracy_reward '{accuracy_reward}' is not one of the rewards {names}")
    return ks


def _add_sampled(
    result: EvalResult, sampled: list[list[dict]], temperature: float, ks: list[int], names: list[str]
) -> None:
    """Attach each prompt's sampled completions to its sample and fill the sampled metrics of ``result``."""
    for s, rows in zip(result.samples, sampled):
        s["sampled"] = rows
        s["sampled_correct"] = sum(r["correct"] for r in rows)
    sampled_rows = [r for rows in sampled for r in rows]
    result.temperature = temperature
    result.sampled_accuracy = rate(r["correct"] for r in sampled_rows)
    result.pass_at_k = pass_at_k_table(result.num_samples, [s["sampled_correct"] for s in result.samples], ks)
    result.sampled_reward_mean = mean(r["reward"] for r in sampled_rows)
    result.sampled_rewards = {name: _applied_mean(r["rewards"][name] for r in sampled_rows) for name in names}


def _greedy_result(
    samples: list[dict], names: list[str], num_samples: int, accuracy_reward: str, success_threshold: float
) -> EvalResult:
    """The evaluation's figures over its greedy (one a prompt) samples."""
    return EvalResult(
        accuracy=rate(s["correct"] for s in samples),
        reward_mean=mean(s["reward"] for s in samples),
        rewards={name: _applied_mean(s["rewards"][name] for s in samples) for name in names},
        num_prompts=len(samples),
        completion_length_mean=mean(s["length"] for s in samples),
        truncation_rate=rate(s["finish_reason"] == "length" for s in samples),
        seconds=0.0,
        samples=samples,
        repetition_mean=mean(s["repetition"] for s in samples),
        num_samples=num_samples,
        accuracy_reward=accuracy_reward,
        success_threshold=success_threshold,
    )


def _judged(
    text: str, finish: str, length: int, rewards: dict[str, float], total: float, accuracy_reward: str, threshold: float
) -> dict:
    """One scored completion's record; ``correct`` when the accuracy reward reaches ``threshold``."""
    accuracy = rewards[accuracy_reward]
    return {
        "completion": text,
        "rewards": rewards,
        "reward": total,
        "length": length,
        "finish_reason": finish,
        "correct": accuracy is not None and accuracy >= threshold,
    }


def evaluate(
    engine: RolloutEngine,
    examples,
    reward_manager,
    *,
    max_new_tokens: int,
    batch_size: int,
    accuracy_reward: str,
    success_threshold: float,
    greedy: bool = True,
    num_samples: int = 0,
    temperature: float = 1.0,
    pass_k: Sequence[int] = (1,),
    seed: int | None = None,
) -> EvalResult:
    """One completion per prompt (greedy by default) scored by every reward; with ``num_samples > 0``
    also that many sampled completions per prompt at ``temperature`` for sampled accuracy and pass@k
    (each k in ``pass_k`` must be between 1 and ``num_samples``).

    ``batch_size`` is the number of prompts per greedy generation batch; sampled batches hold at most
    ``batch_size`` sequences (at least one prompt). With ``seed`` all generation runs on a separate
    random stream seeded with it, so results are reproducible and the global stream is not advanced.
    """
    names = list(reward_manager.names)
    ks = _checked_pass_k(num_samples, pass_k, accuracy_reward, names)
    start = time.perf_counter()
    samples: list[dict] = []
    judged = functools.partial(_judged, accuracy_reward=accuracy_reward, threshold=success_threshold)
    with _seeded(seed):
        greedy_params = SamplingParams(max_new_tokens=max_new_tokens, n=1, greedy=greedy)
        for _, ex, text, finish, length, rewards, total, episode in _generate_scored(
            engine, examples, reward_manager, greedy_params, batch_size
        ):
            verdict = judged(text, finish, length, rewards, total)
            samples.append({"source": ex.source, "prompt": ex.prompt, **verdict, "repetition": repetition_score(text)})
            samples[-1].update(episode)
        sampled: list[list[dict]] = [[] for _ in samples]
        if num_samples > 0:
            params = SamplingParams(max_new_tokens=max_new_tokens, n=num_samples, temperature=temperature)
            per_batch = max(1, batch_size // num_samples)
            for idx, _, text, finish, length, rewards, total, _ in _generate_scored(
                engine, examples, reward_manager, params, per_batch
            ):
                sampled[idx].append(judged(text, finish, length, rewards, total))
    result = _greedy_result(samples, names, num_samples, accuracy_reward, success_threshold)
    if num_samples > 0:
        _add_sampled(result, sampled, temperature, ks, names)
    if samples and "episode" in samples[0]:
        result.episodes = episode_summary([s["episode"] for s in samples])
    result.seconds = time.perf_counter() - start
    return result
