"""The RL job: rollout -> reward -> advantage -> policy (and critic) update, one step at a time.

Read :meth:`RLJob.train_step` top to bottom; every piece it calls is a plain function or a small
object built in :meth:`RLJob.build` (see :mod:`rlft.rl.build`). The run around it (directory,
checkpoints, resume, cadence) is the shared lifecycle, :class:`rlft.trainer.trainer.Trainer`.
"""

from __future__ import annotations

import time
from typing import Any

from rlft.config.presets import PRESETS
from rlft.config.schema import JOB_KINDS, RLConfig
from rlft.data.prompts import load_prompts
from rlft.data.sampler import PromptSampler
from rlft.distributed import current
from rlft.health import HealthMonitor
from rlft.logging.console import get_logger
from rlft.logging.run_dir import RunDirectory, append_jsonl
from rlft.rewards.manager import RewardManager
from rlft.rl.batch import UpdateBatch
from rlft.rl.build import (
    build_advantage_stage,
    build_collector,
    build_critic,
    build_data,
    build_updater,
    warn_slow_rollout,
)
from rlft.rl.episodes import env_tools, environment_line, episode_runner, reward_manager
from rlft.rl.exclusion import ExclusionPolicy, exclude_rows
from rlft.rl.metrics import episode_metrics, format_step_line
from rlft.rl.parallel import global_rollout_metrics, mean_over_processes, refresh_replica, spread_over_processes
from rlft.speed.clock import CLOCK, phase
from rlft.trainer.generation import GenerationSettings, evaluate_generations
from rlft.trainer.job import EvalRecord, TrainedState, total_steps
from rlft.trainer.metrics import peak_memory_mb
from rlft.trainer.parts import build_model


class RLJob:
    """One RL fine-tuning job (``kind: rl``): the algorithm is chosen by ``algorithm.name``."""

    CONTINUITY = JOB_KINDS["rl"].continuity

    def __init__(self, cfg: RLConfig):
        self.cfg = cfg
        self._last_reward = 0.0

    def build(self, run_dir: RunDirectory) -> None:
        cfg, alg = self.cfg, self.cfg.algorithm
        self.log = get_logger()
        self.samples_file = run_dir.samples
        self.run_root = run_dir.root
        # Without a KL term the reference is never used, so don't pay for a copy of the weights.
        self.parts = build_model(cfg.model, with_reference=alg.uses_reference())
        self.device, self.model_dir = self.parts.device, self.parts.model_dir
        self.dist = current()
        self.dist.shard(list(range(alg.rollout_batch_size)), "algorithm.rollout_batch_size (prompts per step)")
        self.replica = spread_over_processes(self.parts, self.dist)  # the rollout's whole weights under fsdp2
        self.train_set, self.eval_set = build_data(cfg, self.parts.tokenizer)
        self.rewards = self.reward_manager(cfg)
        self.engine = self.generation(cfg).make_engine(
            self.replica or self.parts.model, self.parts.tokenizer, self.parts.autocast_dtype
        )
        warn_slow_rollout(cfg, self.parts)
        self.sampler = PromptSampler(
            len(self.train_set), alg.rollout_batch_size, seed=cfg.train.seed, shuffle=cfg.data.shuffle
        )
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = total_steps(cfg.train, self.steps_per_epoch)
        self.collector = build_collector(cfg, self.engine, self.rewards, self.train_set, self.sampler, self.dist)
        self.updater = build_updater(cfg, self.parts, self.total_steps, self.dist)
        self.critic = build_critic(cfg, self.parts, self.dist)
        self.advantage, self.kl = build_advantage_stage(cfg, self.dist)
        self._exclusion = ExclusionPolicy(alg.exclude_machinery_failures, self.log)
        self.health = HealthMonitor(cfg.train.health, cfg.eval.accuracy_reward or self.rewards.names[0], self.log)

    def describe(self) -> list[str]:
        alg = self.cfg.algorithm
        params = ", ".join(f"{k}={v}" for k, v in alg.model_dump().items() if k != "name")
        return [
            f"algorithm: {alg.name} -- {PRESETS[alg.name].summary}",
            f"algorithm parameters in effect: {params}",
            "rewards: " + ", ".join(f"{n} (weight {w})" for n, w in self.rewards.weights.items()),
            *environment_line(self.cfg),
            f"training for {self.total_steps} steps: {alg.rollout_batch_size} prompts x "
            f"{alg.num_generations} completions per step, {self.steps_per_epoch} steps per epoch",
        ] + (
            [
                f"data parallel: {self.dist.world_size} processes ({self.dist.strategy}, {self.dist.backend}), "
                f"{alg.rollout_batch_size // self.dist.world_size} prompts x {alg.num_generations} completions "
                f"each per step"
            ]
            if self.dist.enabled
            else []
        )

    # ------------------------------------------------------------------ one step

    def train_step(self, step: int) -> dict[str, float]:
        """Collect a scored batch, score it under the policies, advantages, update."""
        alg = self.cfg.algorithm
        CLOCK.reset()
        t0 = time.perf_counter()
        collected = self.collector.collect()
        self.engine.release_memory()  # what only generation needs goes to the update
        t_gen = time.perf_counter() - t0
        batch = UpdateBatch.from_rollout(collected.rollout)
        excluded = self._exclusion.assess(collected.rollout.finish_reasons, collected.scored.failed)
        exclude_rows(batch, excluded.valid)  # before scoring: the KL of a left-out row is no statistic either
        kl_coef = self.kl.coef
        self.updater.score(batch, kl_coef=kl_coef)
        if self.critic is not None:
            with phase("critic"):
                batch.old_values = self.critic.values(batch)
        stats = self.advantage.apply(collected.scored.total, batch, kl_coef, excluded.valid)
        learn = self._anything_left(step, excluded)
        lr = self.updater.optimizer.param_groups[0]["lr"]
        t1 = time.perf_counter()
        if self.critic is not None and learn:
            with phase("critic"):
                stats.update(self.critic.update(batch))
        # The critic trains alone for its warm-up steps (step counts from 1).
        if learn and (self.critic is None or step > alg.critic.warmup_steps):
            stats.update(self.updater.update(batch, kl_coef=kl_coef))
            refresh_replica(self.replica, self.parts.model, self.dist)
        stats["kl_coef"] = kl_coef
        self.kl.observe(stats.get("kl"), len(batch))
        seconds = time.perf_counter() - t0
        rollout, scored = collected.rollout, collected.scored
        episodes = episode_metrics(rollout.episodes) if rollout.episodes is not None else {}
        metrics = {**episodes, **scored.extra, **collected.stats, **excluded.metrics, **stats}
        metrics.update(
            {
                "lr": lr,
                "step_seconds": seconds,
                "generation_seconds": t_gen,
                "update_seconds": time.perf_counter() - t1,
                "tokens_per_s": float(batch.loss_mask.sum().item()) / seconds,
                "peak_mem_mb": peak_memory_mb(self.device),
            }
        )
        metrics.update(CLOCK.snapshot(seconds))
        metrics = mean_over_processes(metrics, self.dist)
        if self.dist.enabled:  # throughput is the run's: every process's tokens in the same wall time
            metrics["tokens_per_s"] *= self.dist.world_size
            metrics.update({k: metrics[k] * self.dist.world_size for k in excluded.metrics})  # counts: the run's
        self._exclusion.report(metrics, excluded.metrics)
        metrics.update(
            global_rollout_metrics(
                scored, rollout, alg.num_generations, self.rewards.weights, self.dist, excluded.valid
            )
        )
        self._last_reward = metrics["reward/mean"]
        self._write_samples(step, collected.prompts, rollout, scored, excluded.valid)
        self.health.observe_step(step, metrics)
        return metrics

    def _anything_left(self, step: int, excluded) -> bool:
        """Whether any process has a row to learn from this step (every process takes the same branch)."""
        if excluded.valid is None:
            return True
        keys = sorted(excluded.metrics)
        left, *counts = self.dist.sum_floats(float(excluded.valid.sum()), *(excluded.metrics[k] for k in keys))
        return self._exclusion.anything_left(step, left, dict(zip(keys, counts)))

    def _write_samples(self, step: int, prompts, rollout, scored, valid=None) -> None:
        """Every logging step, ``train.samples_per_log`` rows to samples.jsonl; a multi-turn row has
        its whole trajectory (every turn, tool call, arguments, result, error) and episode statistics.
        A row the machinery ended (``valid`` [N] False) says ``"excluded": true``: it was left out of
        its group's baseline and the loss."""
        n, texts = self.cfg.train.samples_per_log, rollout.texts
        if n == 0 or step % self.cfg.train.logging_interval or not self.dist.is_main:
            return
        for i in _sample_rows(len(texts), self.cfg.algorithm.num_generations, n):
            row = {
                "step": step,
                "prompt": prompts[i],
                "completion": texts[i],
                "reward": float(scored.total[i]),
                "rewards": {k: None if v[i].isnan() else float(v[i]) for k, v in scored.per_reward.items()},
            }
            if valid is not None and not bool(valid[i]):
                row.update(excluded=True, finish_reason=rollout.finish_reasons[i])
            if rollout.episodes is not None:
                row.update(trajectory=rollout.columns["trajectories"][i], episode=rollout.episodes[i].as_dict())
            append_jsonl(self.samples_file, row)

    def stop_reason(self) -> str | None:
        """Why the run should stop before its last step (``train.health.stop_on_no_signal``), else None."""
        return self.health.stop_reason()

    def health_summary(self) -> dict:
        """The run's health verdict and findings so far (run.json's ``health``)."""
        return self.health.summary()

    def conclude_health(self, step: int) -> dict:
        """The run ended after ``step`` (completed, or stopped itself): the checks that judge the whole run
        have their say (:meth:`rlft.health.HealthMonitor.observe_end`), then the verdict and findings."""
        self.health.observe_end(step)
        return self.health.summary()

    def step_line(self, step: int, metrics: dict[str, float]) -> str:
        return format_step_line(step, self.total_steps, metrics)

    def progress_info(self) -> str:
        return f"reward {self._last_reward:.3f}"

    # ------------------------------------------------------------------ eval / state

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        """Greedy evaluation on the eval set (plus eval.num_samples sampled completions per prompt for
        pass@k), on its own random stream seeded with train.seed."""
        if self.eval_set is None:
            return None
        res = evaluate_generations(
            self.engine, self.eval_set.examples, self.rewards, self.cfg, self.generation(self.cfg).max_new_tokens
        )
        self.health.observe_eval(step, res.accuracy, res.num_prompts, res.rewards)
        payload = {**res.summary(), "health": self.health.summary(), "samples": res.samples}
        return EvalRecord(res, f"{res.metrics_line()} ({res.seconds:.0f}s)", payload)

    def state(self) -> TrainedState:
        return TrainedState(
            self.parts.model,
            self.parts.tokenizer,
            self.updater.optimizer,
            self.updater.scheduler,
            self.sampler,
            {"critic": self.critic} if self.critic is not None else {},
            {"kl_coef": self.kl.coef},
            export_model=self.replica,
        )

    def restore(self, extra: dict[str, Any]) -> None:
        self.kl.coef = float(extra.get("kl_coef", self.kl.coef))
        refresh_replica(self.replica, self.parts.model, self.dist)  # the resumed weights, for the rollout
        self._resume_health(int(extra.get("step", 0)))

    def _resume_health(self, step: int) -> None:
        """The health checks go on from the run's logged history up to the resumed step (a streak of
        steps without signal before the stop counts), without saying its findings again."""
        from rlft.health.report import replay
        from rlft.logging.plots import RunData, read_evals, read_metrics

        if not step or not self.run_root.joinpath("metrics.jsonl").is_file():
            return
        run = RunData(
            self.run_root,
            self.run_root.name,
            [r for r in read_metrics(self.run_root / "metrics.jsonl") if r["step"] <= step],
            [e for e in read_evals(self.run_root) if e["step"] <= step],
        )
        self.health.log = None  # findings the run already said before it stopped
        replay(run, self.cfg.train.health, None, self.health)
        self.health.log = self.log

    @staticmethod
    def eval_prompts(cfg: RLConfig, tokenizer) -> list | None:
        evalset = load_prompts(cfg.data, tokenizer, "eval", cfg.train.seed, env_tools(cfg))
        return evalset.examples if evalset is not None else None

    @staticmethod
    def generation(cfg: RLConfig) -> GenerationSettings:
        return GenerationSettings(
            cfg.rollout.engine,
            cfg.data.max_prompt_length,
            cfg.eval.max_new_tokens or cfg.algorithm.max_new_tokens,
            add_special_tokens=not cfg.data.use_chat_template,
            episodes=episode_runner(cfg),
            decode_copy=bool(cfg.rollout.decode_copy),  # 'auto' the memory plan left on
            fused_decode=cfg.rollout.fused_decode,
            engine_options=cfg.rollout.engine_options(),
        )

    @staticmethod
    def reward_manager(cfg: RLConfig) -> RewardManager:
        return reward_manager(cfg)

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        if before is None or after is None:
            return []
        return [
            f"held-out accuracy: before {before.result.accuracy:.1%} -> after {after.result.accuracy:.1%} "
            f"({after.result.num_prompts} prompts)"
        ]


def _sample_rows(rows: int, group: int, n: int) -> list[int]:
    """``n`` of ``rows`` completions to log, whole groups first: rows of one prompt are adjacent, so
    the completions a GRPO advantage compares are read side by side. Groups evenly spaced."""
    groups = max(rows // max(group, 1), 1)
    wanted = min(-(-n // group), groups)
    picked = [g * groups // wanted for g in range(wanted)]
    return [i for g in picked for i in range(g * group, min((g + 1) * group, rows))][:n]
