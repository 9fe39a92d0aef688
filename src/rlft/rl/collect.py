"""Collecting one step's training batch: sample, score, shape, and (DAPO) keep only informative groups."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from rlft.algorithms import groups_with_signal, overlong_penalty
from rlft.distributed.context import Dist
from rlft.evaluation import columns_of
from rlft.logging.console import get_logger
from rlft.rewards.manager import RewardResult
from rlft.rl.exclusion import machinery_failures
from rlft.rollout import RolloutBatch, SamplingParams
from rlft.rollout.sampling import batch_seed
from rlft.speed.clock import phase

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

    def select_groups(self, keep: torch.Tensor, group_size: int) -> Collected:
        """Only the groups (runs of ``group_size`` rows) where ``keep`` [num_groups] is True."""
        rows = [g * group_size + i for g in keep.nonzero().flatten().tolist() for i in range(group_size)]
        idx = torch.tensor(rows, dtype=torch.long)
        scored = self.scored.rows(idx)
        return Collected(self.rollout.select(rows), [self.examples[r] for r in rows], scored)

    @staticmethod
    def concat(parts: list[Collected]) -> Collected:
        first = parts[0].scored
        failed = (
            None if first.failed is None else torch.cat([p.scored.failed for p in parts if p.scored.failed is not None])
        )
        scored = RewardResult(
            torch.cat([p.scored.total for p in parts]),
            {k: torch.cat([p.scored.per_reward[k] for p in parts]) for k in first.per_reward},
            first.names,
            parts[-1].scored.extra,
            failed,
        )
        return Collected(
            RolloutBatch.concat([p.rollout for p in parts]), [e for p in parts for e in p.examples], scored
        )


@dataclass(frozen=True)
class CollectParams:
    """sampling: how to sample; batch_prompts: prompts (groups) per step; overlong_buffer: the soft
    overlong penalty's buffer as a fraction of max_new_tokens (0 = off); dynamic_sampling: keep only
    groups with reward variance, sampling up to max_rounds batches of prompts to fill the step;
    exclude_machinery_failures: a reward service down after its retries marks the samples it lost
    (``RewardResult.failed``) instead of stopping the run, and dynamic sampling judges a group by the
    rows that count (:mod:`rlft.rl.exclusion`)."""

    sampling: SamplingParams
    batch_prompts: int
    overlong_buffer: float = 0.0
    overlong_penalty: float = 1.0
    dynamic_sampling: bool = False
    max_rounds: int = 1
    seed: int = 0  # train.seed: with the data position, the seed of each batch's sampling
    exclude_machinery_failures: bool = False


class RolloutCollector:
    """Samples and scores each step's batch. In a data-parallel run every process draws the same
    prompts from the sampler and generates only its contiguous share (whole groups); each row's
    random draws depend on its global number, not on the process (:class:`SamplingParams.seed`)."""

    def __init__(self, engine, rewards, train_set, sampler, params: CollectParams, dist: Dist | None = None):
        self.engine, self.rewards, self.train_set, self.sampler, self.p = engine, rewards, train_set, sampler, params
        self.dist = dist or Dist()

    def collect(self) -> Collected:
        """One step's batch. With dynamic sampling, groups whose rewards are all equal are dropped and more
        prompts are sampled until ``batch_prompts`` groups are kept (over all processes) or ``max_rounds``
        batches were drawn; a short batch is trained on as it is (never padded with the dropped groups)."""
        if not self.p.dynamic_sampling:
            return self._sample()
        group, kept, n_kept, dropped, rounds = self.p.sampling.n, [], 0, 0, 0
        while n_kept < self.p.batch_prompts and rounds < self.p.max_rounds:
            part = self._sample()
            rounds += 1
            keep = groups_with_signal(part.scored.total, group, self._valid(part))
            n_here, n_dropped = self.dist.sum_floats(float(keep.sum()), float((~keep).sum()))
            dropped += int(n_dropped)
            kept.append(part.select_groups(keep, group) if keep.any() else None)
            n_kept += int(n_here)
        stats = {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/dropped_groups": float(dropped),
            "dynamic_sampling/kept_groups": float(min(n_kept, self.p.batch_prompts)),
        }
        if n_kept < self.dist.world_size:  # nothing (or less than a group per process) to learn from
            get_logger().warning(
                f"dynamic sampling: {dropped} of {dropped + n_kept} groups in {rounds} rounds had "
                f"equal rewards; training on the last batch (no learning signal this step)"
            )
            part.stats = stats
            return part
        out = self._share_of(kept, n_kept)
        out.stats = stats
        return out

    def _valid(self, part: Collected) -> torch.Tensor | None:
        """[N] the rows that count (:mod:`rlft.rl.exclusion`), when machinery failures are left out."""
        if not self.p.exclude_machinery_failures:
            return None
        failed = machinery_failures(part.rollout.finish_reasons, part.scored.failed).values()
        return ~torch.stack(list(failed)).any(dim=0)

    def _share_of(self, kept: list[Collected | None], n_kept: int) -> Collected:
        """The first ``batch_prompts`` kept groups of all processes, in the order one process would
        have kept them (round by round, rank by rank), split again into equal contiguous shares.
        ``kept``: this process's kept groups of each round (None: none that round)."""
        group = self.p.sampling.n
        by_rank = self.dist.gather_objects(kept) if self.dist.enabled else [kept]
        parts = [part for r in range(len(kept)) for ranks in by_rank if (part := ranks[r]) is not None]
        out = Collected.concat(parts)
        n = min(n_kept, self.p.batch_prompts)
        share = -(-n // self.dist.world_size)
        lo, hi = self.dist.rank * share, min((self.dist.rank + 1) * share, n)
        return (
            out.select_groups((torch.arange(n_kept) >= lo) & (torch.arange(n_kept) < hi), group)
            if (lo, hi) != (0, n_kept)
            else out
        )

    def _sample(self) -> Collected:
        batch = self.sampler.next_batch()
        seed = batch_seed(self.p.seed, self.sampler.epoch, self.sampler.position)
        mine = self.dist.shard(batch, "algorithm.rollout_batch_size (prompts per step)")
        sampling = replace(self.p.sampling, seed=seed, row_offset=self.dist.rank * len(mine) * self.p.sampling.n)
        examples = [self.train_set.examples[i] for i in mine]
        rollout = self.engine.run(examples, sampling)
        row_examples = [examples[i] for i in rollout.prompt_index]
        with phase("reward"):
            scored = self.rewards.score(
                [ex.prompt for ex in row_examples],
                rollout.texts,
                {**columns_of(row_examples), **(rollout.columns or {})},
                tolerate_outages=self.p.exclude_machinery_failures,
            )
        if self.p.overlong_buffer > 0:
            max_len = self.p.sampling.max_new_tokens
            penalty = overlong_penalty(
                rollout.completion_lengths.cpu(),
                max_len=max_len,
                buffer_len=max(1, round(self.p.overlong_buffer * max_len)),
                factor=self.p.overlong_penalty,
            )
            scored = RewardResult(
                scored.total + penalty,
                {**scored.per_reward, OVERLONG: penalty},
                scored.names + [OVERLONG],
                scored.extra,
                scored.failed,
            )
        return Collected(rollout, row_examples, scored)
