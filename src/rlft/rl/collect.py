"""Collecting one step's training batch: sample, score, shape, and (DAPO) keep only informative groups."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlft.algorithms import groups_with_signal, overlong_penalty
from rlft.evaluation import columns_of
from rlft.logging.console import get_logger
from rlft.phases import phase
from rlft.rewards.manager import RewardResult
from rlft.rollout import RolloutBatch, SamplingParams

OVERLONG = "overlong_penalty"


@dataclass
class Collected:
    """rollout: N rows; examples: the prompt example of each row; scored: its rewards (shaping included)."""

    rollout: RolloutBatch
    examples: list
    scored: RewardResult
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def prompts(self) -> list[str]:
        return [ex.prompt for ex in self.examples]

    def select_groups(self, keep: torch.Tensor, group_size: int) -> "Collected":
        """Only the groups (runs of ``group_size`` rows) where ``keep`` [num_groups] is True."""
        rows = [g * group_size + i for g in keep.nonzero().flatten().tolist() for i in range(group_size)]
        idx = torch.tensor(rows, dtype=torch.long)
        scored = RewardResult(self.scored.total[idx], {k: v[idx] for k, v in self.scored.per_reward.items()},
                              self.scored.names, self.scored.extra)
        return Collected(self.rollout.select(rows), [self.examples[r] for r in rows], scored)

    @staticmethod
    def concat(parts: list["Collected"]) -> "Collected":
        first = parts[0].scored
        scored = RewardResult(torch.cat([p.scored.total for p in parts]),
                              {k: torch.cat([p.scored.per_reward[k] for p in parts]) for k in first.per_reward},
                              first.names, parts[-1].scored.extra)
        return Collected(RolloutBatch.concat([p.rollout for p in parts]), [e for p in parts for e in p.examples],
                         scored)


@dataclass(frozen=True)
class CollectParams:
    """sampling: how to sample; batch_prompts: prompts (groups) per step; overlong_buffer: the soft
    overlong penalty's buffer as a fraction of max_new_tokens (0 = off); dynamic_sampling: keep only
    groups with reward variance, sampling up to max_rounds batches of prompts to fill the step."""

    sampling: SamplingParams
    batch_prompts: int
    overlong_buffer: float = 0.0
    overlong_penalty: float = 1.0
    dynamic_sampling: bool = False
    max_rounds: int = 1


class RolloutCollector:
    def __init__(self, engine, rewards, train_set, sampler, params: CollectParams):
        self.engine, self.rewards, self.train_set, self.sampler, self.p = engine, rewards, train_set, sampler, params

    def collect(self) -> Collected:
        """One step's batch. With dynamic sampling, groups whose rewards are all equal are dropped and more
        prompts are sampled until ``batch_prompts`` groups are kept or ``max_rounds`` batches were drawn;
        a short batch is trained on as it is (never padded with the dropped groups)."""
        if not self.p.dynamic_sampling:
            return self._sample()
        group, kept, n_kept, dropped, rounds = self.p.sampling.n, [], 0, 0, 0
        while n_kept < self.p.batch_prompts and rounds < self.p.max_rounds:
            part = self._sample()
            rounds += 1
            keep = groups_with_signal(part.scored.total, group)
            dropped += int((~keep).sum())
            if keep.any():
                kept.append(part.select_groups(keep, group))
                n_kept += int(keep.sum())
        stats = {"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/dropped_groups": float(dropped),
                 "dynamic_sampling/kept_groups": float(min(n_kept, self.p.batch_prompts))}
        if not kept:
            get_logger().warning(f"dynamic sampling: all {dropped} groups of {rounds} rounds had equal rewards; "
                                 f"training on the last batch (no learning signal this step)")
            kept, n_kept = [part], self.p.batch_prompts
        out = Collected.concat(kept)
        if n_kept > self.p.batch_prompts:
            out = out.select_groups(torch.arange(n_kept) < self.p.batch_prompts, group)
        out.stats = stats
        return out

    def _sample(self) -> Collected:
        examples = [self.train_set.examples[i] for i in self.sampler.next_batch()]
        rollout = self.engine.run(examples, self.p.sampling)
        row_examples = [examples[i] for i in rollout.prompt_index]
        with phase("reward"):
            scored = self.rewards.score([ex.prompt for ex in row_examples], rollout.texts,
                                        {**columns_of(row_examples), **(rollout.columns or {})})
        if self.p.overlong_buffer > 0:
            max_len = self.p.sampling.max_new_tokens
            penalty = overlong_penalty(rollout.completion_lengths.cpu(), max_len=max_len,
                                       buffer_len=max(1, round(self.p.overlong_buffer * max_len)),
                                       factor=self.p.overlong_penalty)
            scored = RewardResult(scored.total + penalty, {**scored.per_reward, OVERLONG: penalty},
                                  scored.names + [OVERLONG], scored.extra)
        return Collected(rollout, row_examples, scored)
