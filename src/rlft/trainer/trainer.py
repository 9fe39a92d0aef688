"""The run lifecycle every kind of job shares: run directory, logs, the step loop, checkpoints,
exact resume, evaluation cadence and ``run.json``.

Read :meth:`Trainer.train` top to bottom. What differs between kinds (an RL step, an SFT step,
their evaluations) is a :class:`~rlft.trainer.job.Job` picked by the config's ``kind``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlft.checkpoint import prune_checkpoints, save_checkpoint
from rlft.checkpoint.continuity import file_fingerprint
from rlft.config.loader import config_to_yaml, load_config
from rlft.config.schema import RunConfig
from rlft.distributed.context import Dist
from rlft.logging.console import ProgressBar, get_logger, quiet_library_progress_bars
from rlft.logging.run_dir import append_jsonl
from rlft.trainer.job import EvalRecord, Job, job_class
from rlft.trainer.metrics import MetricWindow
from rlft.trainer.observers import Observers
from rlft.trainer.parts import seed_everything
from rlft.trainer.process import (
    StopRequest,
    configure_compute,
    ended_by,
    join_process_group,
    leave_process_group,
    stop_note,
)
from rlft.trainer.resuming import (
    ResumePlan,
    log_plan,
    open_run_directory,
    plan_resume,
    restore_run,
    set_aside_later_than,
)


@dataclass
class TrainResult:
    """Where a run wrote everything; eval_before/eval_after are the job's evaluation results
    (an ``EvalResult`` for RL; for SFT one with the eval loss and, with rewards, accuracy)."""

    run_dir: Path
    steps: int
    final_checkpoint: Path | None
    eval_before: Any = None
    eval_after: Any = None
    last_metrics: dict = field(default_factory=dict)
    train_seconds: float = 0.0
    stopped_by: int | None = None  # the signal that stopped the run early (SIGTERM, SIGINT), else None
    health: dict | None = None  # the job's health verdict and findings (rlft.health), for jobs that check it
    halted: str | None = None  # why the job stopped itself before its last step (train.health.stop_on_no_signal)
    best_checkpoint: Path | None = None  # train.save_best: the best held-out evaluation's model (checkpoints/best)


class Trainer:
    """Runs one training job described by a config: RL (``kind: rl``, the default) or SFT (``kind: sft``).

    >>> Trainer(config_path="configs/minimal_example.yaml", output_dir="./outputs").train()

    ``kind`` is the kind the caller runs (``rlft sft`` passes ``"sft"``); a config of another
    kind is refused with the command that runs it. None takes the config's own ``kind``.
    ``run_dir``: write the run exactly there (the job service names it before the process starts)
    instead of ``<train.output_dir>/<train.run_name>``.
    """

    def __init__(
        self,
        config_path: str | Path | None = None,
        *,
        config: RunConfig | dict | None = None,
        output_dir: str | Path | None = None,
        overrides: list[str] | None = None,
        resume_from: str | Path | None = None,
        kind: str | None = None,
        run_dir: str | Path | None = None,
    ):
        if isinstance(config, RunConfig):
            cfg = config
        else:
            cfg = load_config(config_path, overrides=overrides, data=config, kind=kind)
        if output_dir is not None:
            cfg.train.output_dir = str(Path(output_dir).expanduser().resolve())
        self.cfg = cfg
        self.config_source = str(config_path) if config_path else "<dict>"
        self.resume_from = str(resume_from) if resume_from else None
        self.run_dir_path = Path(run_dir).expanduser().resolve() if run_dir else None
        self.job: Job = job_class(cfg)(cfg)
        self.step = 0
        self.train_seconds = 0.0  # wall time inside train steps (excludes model load, evaluation, checkpoints)
        self.dist = Dist()  # this process's place in a data-parallel run; joined in setup()
        self._plan = ResumePlan()  # where the run continues from; decided in setup()
        self._ready = False

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Create (or, on resume, reopen) the run directory, then let the job build its parts.

        A failure here is recorded in run.json like a failure during training."""
        from rlft.data.read_once import read_once
        from rlft.models.loading import tokenizer_once

        # the prompts (and the tokenizer) the memory check measures them with are those the job reads: read once
        with read_once(), tokenizer_once():
            self._setup()

    def _setup(self) -> None:
        cfg = self.cfg
        self.dist = join_process_group(cfg)
        self._plan = plan_resume(
            self.resume_from, cfg, self.job.CONTINUITY, self.run_dir_path, self.config_source, self.dist
        )
        from rlft.distributed.strategy import strategy_of
        from rlft.planner.check import check_memory

        # refused before anything is written if it won't fit (one process's share, in a data-parallel run)
        self._memory = memory = check_memory(cfg, get_logger(), self.dist.world_size, strategy_of(self.dist).shards)
        self.run_dir = open_run_directory(self._plan, cfg, self.run_dir_path, self.dist)
        self.watch = Observers.open(cfg, self.run_dir, self.dist, self._plan.step, memory)
        self.run_dir.write_run_info(
            status="starting",
            kind=cfg.kind,
            config=self.config_source,
            started=time.time(),
            **({"memory": memory.as_dict()} if memory else {}),
        )
        self.log.info(f"config loaded: {self.config_source} -> run directory {self.run_dir.root}")
        if memory is not None:
            self.log.info(
                f"memory: predicted peak {memory.peak_bytes / 2**30:.2f} GiB ({memory.peak_phase}) of "
                f"{memory.device_bytes / 2**30:.1f} GiB on {memory.device}"
            )
        log_plan(self._plan, self.resume_from, self.log)
        if self._plan.restart_root is not None and self.dist.is_main:
            set_aside_later_than(self.run_dir.root, 0, None, self.log)
        configure_compute(self.cfg, self.log)
        try:
            self._build()
        except BaseException as exc:
            self._close(**self._ended_by(exc))
            raise
        self._ready = True

    def _build(self) -> None:
        if not ProgressBar.enabled_for(self.cfg.train.progress_bar):
            quiet_library_progress_bars()
        seed_everything(self.cfg.train.seed)
        self.job.build(self.run_dir)
        self._data_fingerprint = file_fingerprint(self.cfg.data.train_file)
        for line in self.job.describe():
            self.log.info(line)
        if self._plan.point is not None:
            self.step = restore_run(self._plan.point, self.job, self.dist, self.run_dir, self.log)

    def _close(self, together: bool = False, **run_info) -> None:
        """Record the final status, stop the heartbeat and detach this run's log file (API users may
        start another run). ``together``: every process reached this same point of the loop (the run
        finished, or all of them agreed to stop), not an exception that may have hit one alone."""
        if self._ready and "health" not in run_info:  # what the health checks saw, however the run ended
            summary = getattr(self.job, "health_summary", lambda: None)()
            if summary is not None:
                run_info["health"] = summary
        try:
            self.watch.stop(run_info.get("status", "failed"))
            self.run_dir.write_run_info(ended=time.time(), **run_info)
        finally:  # a final run.json that cannot be written (a full disk) still leaves the process clean
            self.watch.detach_log()
            leave_process_group(together)

    @property
    def log(self):
        """The run's logger (its console and, on the main process, its file), opened with the run directory."""
        return self.watch.log

    @property
    def total_steps(self) -> int:
        return self.job.total_steps

    # ------------------------------------------------------------------ loop

    def train(self) -> TrainResult:
        """Run the whole job; returns where everything was written and the before/after evaluation.

        SIGTERM or Ctrl-C stops it after the current step with a checkpoint, status ``cancelled`` and
        ``result.stopped_by`` set; ``--resume auto`` continues from there."""
        with StopRequest() as stop:
            if not self._ready:
                self.setup()
            try:
                return self._run(stop)
            except BaseException as exc:
                self._close(step=self.step, **self._ended_by(exc))
                raise

    def _run(self, stop: StopRequest) -> TrainResult:
        result = TrainResult(run_dir=self.run_dir.root, steps=0, final_checkpoint=None)
        self.run_dir.write_run_info(status="running", total_steps=self.total_steps)
        self.watch.heartbeat.progress()  # the training phase begins: a stall is counted from here
        start_step = self.step
        before = after = None
        if self.cfg.eval.before_training and self.step == 0 and not stop.requested:
            before = self.evaluate(tag="before training")
        window = MetricWindow()
        with ProgressBar(self.total_steps, self.cfg.train.progress_bar if self.dist.is_main else "off") as bar:
            while self.step < self.total_steps and not stop.agreed(self.dist):
                window.add(self.train_step())
                self._after_step(window, bar, result)
                if (halted := self._job_halts()) is not None:
                    self._halt(window, result, halted)
                    break
        result.steps, result.train_seconds = self.step, self.train_seconds
        if stop.requested:
            if self.step > start_step and not self.run_dir.checkpoint(self.step).exists():
                result.final_checkpoint = self.save_checkpoint()
            elif self.run_dir.checkpoint(self.step).exists():
                result.final_checkpoint = self.run_dir.checkpoint(self.step)
            self.log.info(f"stopped by {stop.signal_name} at step {self.step}; {stop_note(result.final_checkpoint)}")
            self._close(together=True, status="cancelled", step=self.step, signal=stop.signal_name)
            result.stopped_by = stop.signal
            return result
        result.final_checkpoint = self.save_checkpoint()
        if self.cfg.eval.after_training:
            after = self.evaluate(tag="after training")
        self._report(before, after)
        result.eval_before = before.result if before else None
        result.eval_after = after.result if after else None
        result.best_checkpoint = self.run_dir.best if self.cfg.train.save_best and self.run_dir.best.exists() else None
        result.health = self._conclude_health()
        self._close(
            together=True,
            status="completed",
            step=self.step,
            **({"health": result.health} if result.health else {}),
            **({"halted": {"step": self.step, "reason": result.halted}} if result.halted else {}),
        )
        return result

    def _job_halts(self) -> str | None:
        """Why the job asks to stop before its last step (a run with no learning signal, when
        train.health.stop_on_no_signal says so), else None. Every process sees the same averaged
        metrics, so all of them agree."""
        return getattr(self.job, "stop_reason", lambda: None)()

    def _halt(self, window: MetricWindow, result: TrainResult, reason: str) -> None:
        """Stop the loop at this step: the steps since the last logged one are logged, and the run
        goes on to its checkpoint, final evaluation and run.json like a finished one."""
        if self.step % self.cfg.train.logging_interval and self.step != self.total_steps:
            self._log_metrics(window, result)
        result.halted = reason
        self.log.warning(f"stopping at step {self.step} of {self.total_steps}: {reason}")

    def _conclude_health(self) -> dict | None:
        """The job's verdict once the run ended: logged as the closing line, returned for run.json and the caller."""
        conclude = getattr(self.job, "conclude_health", None)
        if conclude is None:
            return None
        summary = conclude(self.step)
        from rlft.health import Finding, conclusion

        line = conclusion(Finding.from_dict(f) for f in summary["findings"])
        (self.log.info if summary["verdict"] == "healthy" else self.log.warning)(line)
        return summary

    def train_step(self) -> dict[str, float]:
        """One step of the job; the step count and the training-time total advance here."""
        t0 = time.perf_counter()
        metrics = self.job.train_step(self.step + 1)
        self.step += 1
        self.watch.heartbeat.progress(self.step)  # run.json's progress: the service tells a hung step by it
        self.train_seconds += time.perf_counter() - t0
        return metrics

    def _after_step(self, window: MetricWindow, bar: ProgressBar, result: TrainResult) -> None:
        tcfg = self.cfg.train
        self.watch.resources.step = self.step
        if self.step % tcfg.logging_interval == 0 or self.step == self.total_steps:
            self._log_metrics(window, result)
        bar.advance(self.step, info=self.job.progress_info())
        if self.step % tcfg.save_interval == 0 and self.step < self.total_steps:
            self.save_checkpoint()
        if self.cfg.eval.interval and self.step % self.cfg.eval.interval == 0 and self.step < self.total_steps:
            self.evaluate(tag=f"every {self.cfg.eval.interval} steps")

    def _log_metrics(self, window: MetricWindow, result: TrainResult) -> None:
        """One metrics.jsonl row (the mean of the steps since the last one), the trackers and the log line."""
        metrics = {
            "step": self.step,
            "epoch": round(self.step / self.job.steps_per_epoch, 4),
            **window.flush(),
            **self.watch.resources.step_metrics(),
        }
        if self.dist.is_main:
            append_jsonl(self.run_dir.metrics, metrics)
        self.watch.trackers.log(self.step, metrics)
        self.log.info(self.job.step_line(self.step, metrics))
        result.last_metrics = metrics
        health = getattr(self.job, "health_summary", lambda: None)()  # the verdict so far: the service shows it live
        self.run_dir.write_run_info(step=self.step, **({"health": health} if health else {}))

    # ------------------------------------------------------------------ eval / checkpoint

    def evaluate(self, tag: str = "") -> EvalRecord | None:
        """The job's held-out evaluation; writes eval/step-<N>.json and logs one line.

        Evaluation runs on its own random stream, so it never changes the training trajectory (and
        resumed runs stay bit-identical)."""
        record = self.job.evaluate(self.step, tag)
        if record is None:
            return None
        self.log.info(f"eval ({tag}, step {self.step}): {record.line}")
        out = {"step": self.step, "tag": tag, **record.payload}
        if self.dist.is_main:
            self.run_dir.write_eval_report(self.step, out)  # a full disk: DiskFullError naming the file
        self.watch.trackers.log(self.step, record.payload, prefix="eval/")
        self._keep_if_best(record.payload.get("accuracy"))
        return record

    def _keep_if_best(self, accuracy: float | None) -> None:
        """train.save_best: this evaluation's model to checkpoints/best when it beats the best so far. Not
        at step 0: the base model is already on disk."""
        if not self.cfg.train.save_best or accuracy is None or self.step == 0:
            return
        best = self.run_dir.best_accuracy(self.step)
        better = best is None or accuracy > best
        if self.dist.enabled:  # the save is collective: every process follows rank 0's reading
            better = self.dist.broadcast_object(better)
        if not better:
            return
        target = self.save_checkpoint(self.run_dir.best, save_optimizer=False, accuracy=accuracy)
        was = f"was {best:.1%}" if best is not None else "the first evaluation since training began"
        self.log.info(f"best model so far: accuracy {accuracy:.1%} at step {self.step} ({was}): {target}")
        if self.dist.is_main:
            self.run_dir.write_run_info(best={"step": self.step, "accuracy": accuracy, "path": str(target)})

    def save_checkpoint(self, target: Path | None = None, *, save_optimizer: bool | None = None, **state) -> Path:
        """checkpoint-<step> (or ``target``) with what an exact resume needs; ``state``: more trainer_state."""
        target = target or self.run_dir.checkpoint(self.step)
        parts = self.job.state()
        state = {
            "step": self.step,
            "total_steps": self.total_steps,
            "kind": self.cfg.kind,
            "sampler": parts.sampler.state_dict(),
            "model_dir": self.job.model_dir,
            **parts.extra,
            "data_fingerprint": self._data_fingerprint,
            **state,
        }
        save_checkpoint(
            target,
            model=parts.model,
            tokenizer=parts.tokenizer,
            optimizer=parts.optimizer,
            scheduler=parts.scheduler,
            trainer_state=state,
            config_yaml=config_to_yaml(self.cfg),
            components=parts.components,
            save_optimizer=self.cfg.train.save_optimizer if save_optimizer is None else save_optimizer,
            dist=self.dist,
            export_model=parts.export_model,
        )
        self.log.info(f"checkpoint saved: {target}")
        if self.cfg.train.keep_last and self.dist.is_main:
            for old in prune_checkpoints(self.run_dir.checkpoints, self.cfg.train.keep_last):
                self.log.info(f"checkpoint removed (train.keep_last={self.cfg.train.keep_last}): {old.name}")
        return target

    def _report(self, before: EvalRecord | None, after: EvalRecord | None) -> None:
        self.log.info(
            f"reached step {self.step}; {self.train_seconds / 60:.1f} min of training time in this process "
            f"(model load, evaluation and checkpoints not counted)"
        )
        for line in self.job.report(before, after):
            self.log.info(line)

    def _ended_by(self, exc: BaseException) -> dict:
        return ended_by(exc, self.step, self._memory, self.watch.resources.peak_mb())
