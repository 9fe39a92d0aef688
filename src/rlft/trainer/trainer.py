"""The training loop: rollout -> reward -> advantage -> update -> log -> checkpoint -> eval.

Read :meth:`Trainer.train` top to bottom; every step it calls is a plain
function or a small object built in :meth:`Trainer.setup`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlft.checkpoint import prune_checkpoints, save_checkpoint
from rlft.checkpoint.continuity import file_fingerprint
from rlft.config.loader import config_to_yaml, load_config
from rlft.config.schema import RlftConfig
from rlft.data.sampler import PromptSampler
from rlft.evaluation import EvalResult, evaluate
from rlft.logging.console import (ProgressBar, attach_file_log, get_logger, quiet_library_progress_bars,
                                  setup_console_logging)
from rlft.logging.run_dir import RunDirectory, append_jsonl, truncate_jsonl
from rlft.rewards.manager import RewardManager
from rlft.config.presets import PRESETS
from rlft.rollout import ENGINES
from rlft.trainer.batch import UpdateBatch
from rlft.trainer.components import (build_advantage_stage, build_collector, build_critic, build_data, build_model,
                                     build_updater, seed_everything)
from rlft.trainer.metrics import HealthWatch, MetricWindow, format_step_line, peak_memory_mb, rollout_metrics
from rlft.trainer.watch import RewardHackingWatch


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    final_checkpoint: Path | None
    eval_before: EvalResult | None = None
    eval_after: EvalResult | None = None
    last_metrics: dict = field(default_factory=dict)
    train_seconds: float = 0.0


class Trainer:
    """Runs one RL fine-tuning job described by a config.

    >>> Trainer(config_path="configs/minimal_example.yaml", output_dir="./outputs").train()
    """

    def __init__(self, config_path: str | Path | None = None, *, config: RlftConfig | dict | None = None,
                 output_dir: str | Path | None = None, overrides: list[str] | None = None,
                 resume_from: str | Path | None = None):
        if isinstance(config, RlftConfig):
            cfg = config
        else:
            cfg = load_config(config_path, overrides=overrides, data=config)
        if output_dir is not None:
            cfg.train.output_dir = str(Path(output_dir).expanduser().resolve())
        self.cfg = cfg
        self.config_source = str(config_path) if config_path else "<dict>"
        self.resume_from = str(resume_from) if resume_from else None
        self._ready = False

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Create the run directory, then build model, data, rewards, engine and optimizer.

        A failure here is recorded in run.json like a failure during training."""
        cfg = self.cfg
        self._resume_point = None
        changes: list[str] = []
        if self.resume_from:
            from rlft.checkpoint.resume import check_continuity, find_checkpoint

            named = Path(cfg.train.output_dir).expanduser().resolve() / cfg.train.run_name if cfg.train.run_name else None
            self._resume_point = find_checkpoint(self.resume_from, named)
            # Before anything is written: a refused resume leaves the run directory as it was.
            changes = check_continuity(self._resume_point, yaml.safe_load(config_to_yaml(cfg)), cfg.data.train_file)
            self.run_dir = RunDirectory(self._resume_point.run_root)
        else:
            self.run_dir = RunDirectory.create(cfg.train.output_dir, cfg.train.run_name, cfg.algorithm.name)
        self.log = setup_console_logging()
        self._file_log = attach_file_log(self.run_dir.log)
        self.run_dir.config.write_text(config_to_yaml(cfg))  # the config in effect; each checkpoint keeps its own
        self.run_dir.write_run_info(status="starting", config=self.config_source, started=time.time())
        self.log.info(f"config loaded: {self.config_source} -> run directory {self.run_dir.root}")
        if self._resume_point is not None:
            self._prepare_resume(changes)
        try:
            self._build()
        except BaseException as exc:
            self._close(status="failed", error=f"{type(exc).__name__}: {exc}")
            raise
        self._ready = True

    def _prepare_resume(self, changes: list[str]) -> None:
        step = int(self._resume_point.state["step"])
        for change in changes:
            self.log.info(f"changed on resume: {change}")
        dropped = sum(truncate_jsonl(p, step) for p in (self.run_dir.metrics, self.run_dir.samples))
        if dropped:
            self.log.info(f"dropped {dropped} log records written after step {step} by the interrupted process")

    def _build(self) -> None:

        cfg, alg = self.cfg, self.cfg.algorithm
        if not ProgressBar.enabled_for(cfg.train.progress_bar):
            quiet_library_progress_bars()
        seed_everything(cfg.train.seed)
        self.parts = build_model(cfg)
        self.train_set, self.eval_set = build_data(cfg, self.parts.tokenizer)
        self._data_fingerprint = file_fingerprint(cfg.data.train_file)
        self.rewards = RewardManager.from_specs(cfg.reward.functions)
        self.engine = ENGINES[cfg.rollout.engine](
            self.parts.model, self.parts.tokenizer, max_prompt_length=cfg.data.max_prompt_length,
            autocast_dtype=self.parts.autocast_dtype, add_special_tokens=not cfg.data.use_chat_template)
        self.sampler = PromptSampler(len(self.train_set), alg.rollout_batch_size, seed=cfg.train.seed,
                                     shuffle=cfg.data.shuffle)
        self.total_steps = self._total_steps()
        self.collector = build_collector(cfg, self.engine, self.rewards, self.train_set, self.sampler)
        self.updater = build_updater(cfg, self.parts, self.total_steps)
        self.critic = build_critic(cfg, self.parts)
        self.advantage, self.kl = build_advantage_stage(cfg)
        self.step = 0
        self._health = HealthWatch(self.log)
        self._watch = RewardHackingWatch(cfg.train.watch, self.log, cfg.eval.accuracy_reward or self.rewards.names[0])
        self._log_algorithm()
        if self._resume_point is not None:
            from rlft.checkpoint.resume import restore_training_state

            self.step = restore_training_state(self._resume_point, model=self.parts.model,
                                               optimizer=self.updater.optimizer, scheduler=self.updater.scheduler,
                                               sampler=self.sampler, components=self._components())
            self.kl.coef = float(self._resume_point.state.get("kl_coef", self.kl.coef))
            self.log.info(f"resumed from {self._resume_point.checkpoint} at step {self.step}; continuing to "
                          f"step {self.total_steps}")

    def _close(self, **run_info) -> None:
        """Record the final status and detach this run's log file (API users may start another run)."""
        self.run_dir.write_run_info(ended=time.time(), **run_info)
        get_logger().removeHandler(self._file_log)
        self._file_log.close()

    def _total_steps(self) -> int:
        total = self.cfg.train.epochs * self.sampler.steps_per_epoch
        if self.cfg.train.max_steps is not None:
            total = min(total, self.cfg.train.max_steps)
        return total

    def _log_algorithm(self) -> None:
        alg = self.cfg.algorithm
        params = ", ".join(f"{k}={v}" for k, v in alg.model_dump().items() if k != "name")
        self.log.info(f"algorithm: {alg.name} -- {PRESETS[alg.name].summary}")
        self.log.info(f"algorithm parameters in effect: {params}")
        self.log.info("rewards: " + ", ".join(f"{n} (weight {w})" for n, w in self.rewards.weights.items()))
        self.log.info(f"training for {self.total_steps} steps: {alg.rollout_batch_size} prompts x "
                      f"{alg.num_generations} completions per step, {self.sampler.steps_per_epoch} steps per epoch")

    # ------------------------------------------------------------------ loop

    def train(self) -> TrainResult:
        """Run the whole job; returns where everything was written and the before/after evaluation."""
        if not self._ready:
            self.setup()
        result = TrainResult(run_dir=self.run_dir.root, steps=0, final_checkpoint=None)
        self.run_dir.write_run_info(status="running", total_steps=self.total_steps)
        try:
            if self.cfg.eval.before_training and self.step == 0:
                result.eval_before = self.evaluate(tag="before training")
            window = MetricWindow()
            with ProgressBar(self.total_steps, self.cfg.train.progress_bar) as bar:
                while self.step < self.total_steps:
                    metrics = self.train_step()
                    window.add(metrics)
                    self._health.observe(self.step, metrics)
                    self._watch.observe_step(self.step, metrics)
                    self._after_step(window, bar, result)
            result.final_checkpoint = self.save_checkpoint()
            if self.cfg.eval.after_training:
                result.eval_after = self.evaluate(tag="after training")
            self._report(result)
        except BaseException as exc:
            self._close(status="failed", step=self.step, error=f"{type(exc).__name__}: {exc}")
            raise
        result.steps, result.train_seconds = self.step, self.train_seconds
        self._close(status="completed", step=self.step)
        return result

    def _after_step(self, window: MetricWindow, bar: ProgressBar, result: TrainResult) -> None:
        tcfg = self.cfg.train
        if self.step % tcfg.logging_interval == 0 or self.step == self.total_steps:
            metrics = {"step": self.step, "epoch": round(self.step / self.sampler.steps_per_epoch, 4), **window.flush()}
            append_jsonl(self.run_dir.metrics, metrics)
            self.log.info(format_step_line(self.step, self.total_steps, metrics))
            result.last_metrics = metrics
            self.run_dir.write_run_info(step=self.step)
        bar.advance(self.step, info=f"reward {self._last_reward:.3f}")
        if self.step % tcfg.save_interval == 0 and self.step < self.total_steps:
            self.save_checkpoint()
        if self.cfg.eval.interval and self.step % self.cfg.eval.interval == 0 and self.step < self.total_steps:
            self.evaluate(tag=f"step {self.step}")

    def train_step(self) -> dict[str, float]:
        """One RL step: collect a scored batch, score it under the policies, advantages, update."""
        alg = self.cfg.algorithm
        t0 = time.perf_counter()
        collected = self.collector.collect()
        t_gen = time.perf_counter() - t0
        batch = UpdateBatch.from_rollout(collected.rollout)
        kl_coef = self.kl.coef
        self.updater.score(batch, kl_coef=kl_coef)
        if self.critic is not None:
            batch.old_values = self.critic.values(batch)
        stats = self.advantage.apply(collected.scored.total, batch, kl_coef)
        lr = self.updater.optimizer.param_groups[0]["lr"]
        t1 = time.perf_counter()
        if self.critic is not None:
            stats.update(self.critic.update(batch))
        if self.critic is None or self.step >= alg.critic.warmup_steps:
            stats.update(self.updater.update(batch, kl_coef=kl_coef))
        stats["kl_coef"] = kl_coef
        self.kl.observe(stats.get("kl"), len(batch))
        self.step += 1
        seconds = time.perf_counter() - t0
        rollout, scored = collected.rollout, collected.scored
        metrics = rollout_metrics(scored.total, scored.per_reward, rollout.completion_lengths,
                                  rollout.finish_reasons, alg.num_generations, texts=rollout.texts,
                                  weights=self.rewards.weights)
        metrics.update(collected.stats)
        metrics.update(stats)
        metrics.update({"lr": lr, "step_seconds": seconds, "generation_seconds": t_gen,
                        "update_seconds": time.perf_counter() - t1,
                        "tokens_per_s": float(batch.loss_mask.sum().item()) / seconds,
                        "peak_mem_mb": peak_memory_mb(self.parts.device)})
        self._last_reward = metrics["reward/mean"]
        self.train_seconds += seconds
        self._write_samples(collected.prompts, rollout.texts, scored)
        return metrics

    def _components(self) -> dict:
        """Extra trained parts saved inside each checkpoint, by sub-directory name."""
        return {"critic": self.critic} if self.critic is not None else {}

    _last_reward = 0.0
    train_seconds = 0.0  # wall time inside train steps (excludes model load, evaluation, checkpoints)

    def _write_samples(self, prompts, texts, scored) -> None:
        n = self.cfg.train.samples_per_log
        if n == 0 or self.step % self.cfg.train.logging_interval:
            return
        stride = max(len(texts) // n, 1)
        for i in list(range(0, len(texts), stride))[:n]:
            append_jsonl(self.run_dir.samples, {
                "step": self.step, "prompt": prompts[i], "completion": texts[i],
                "reward": float(scored.total[i]), "rewards": {k: float(v[i]) for k, v in scored.per_reward.items()}})

    # ------------------------------------------------------------------ eval / checkpoint

    def evaluate(self, tag: str = "") -> EvalResult | None:
        """Greedy evaluation on the eval set (plus eval.num_samples sampled completions per prompt for
        pass@k); writes eval/step-<N>.json and logs one line.

        Sampling runs on its own random stream seeded with train.seed, so evaluating never changes
        the training trajectory (and resumed runs stay bit-identical)."""
        if self.eval_set is None:
            return None
        ecfg, alg = self.cfg.eval, self.cfg.algorithm
        examples = self.eval_set.examples[: ecfg.max_samples] if ecfg.max_samples else self.eval_set.examples
        res = evaluate(self.engine, examples, self.rewards, max_new_tokens=ecfg.max_new_tokens or alg.max_new_tokens,
                       batch_size=ecfg.batch_size, accuracy_reward=ecfg.accuracy_reward or self.rewards.names[0],
                       success_threshold=ecfg.success_threshold, num_samples=ecfg.num_samples,
                       temperature=ecfg.temperature, pass_k=ecfg.pass_k, seed=self.cfg.train.seed)
        self.log.info(f"eval ({tag}, step {self.step}): {res.metrics_line()} ({res.seconds:.0f}s)")
        self._watch.observe_eval(self.step, res.accuracy, res.num_prompts)
        out = {"step": self.step, "tag": tag, **res.summary(), "watch": self._watch.flags, "samples": res.samples}
        (self.run_dir.eval_dir / f"step-{self.step}.json").write_text(json.dumps(out, indent=2, ensure_ascii=False))
        return res

    def save_checkpoint(self) -> Path:

        target = self.run_dir.checkpoint(self.step)
        state = {"step": self.step, "total_steps": self.total_steps, "sampler": self.sampler.state_dict(),
                 "model_dir": self.parts.model_dir, "kl_coef": self.kl.coef,
                 "data_fingerprint": self._data_fingerprint}
        save_checkpoint(target, model=self.parts.model, tokenizer=self.parts.tokenizer,
                        optimizer=self.updater.optimizer, scheduler=self.updater.scheduler, trainer_state=state,
                        config_yaml=config_to_yaml(self.cfg), components=self._components())
        self.log.info(f"checkpoint saved: {target}")
        if self.cfg.train.keep_last:
            for old in prune_checkpoints(self.run_dir.checkpoints, self.cfg.train.keep_last):
                self.log.info(f"checkpoint removed (train.keep_last={self.cfg.train.keep_last}): {old.name}")
        return target

    def _report(self, result: TrainResult) -> None:
        before, after = result.eval_before, result.eval_after
        self.log.info(f"reached step {self.step}; {self.train_seconds / 60:.1f} min of training time in this process "
                      f"(model load, evaluation and checkpoints not counted)")
        if before is not None and after is not None:
            self.log.info(f"held-out accuracy: before {before.accuracy:.1%} -> after {after.accuracy:.1%} "
                          f"({after.num_prompts} prompts)")
