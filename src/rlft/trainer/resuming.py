"""Where a run continues from, decided before anything is written, and what the run directory keeps.

``--resume PATH`` continues that checkpoint; ``--resume auto`` the newest intact checkpoint of the
run it finds (``--run-dir``, ``<output_dir>/<run_name>``, or the run of ``output_dir`` made from this
config), starts afresh in place a run that stopped before its first save, and starts a new run when
there is none. A refused resume (a change that breaks continuity, a damaged checkpoint named
explicitly) leaves the run directory as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlft.config.loader import config_to_dict
from rlft.distributed.context import Dist
from rlft.errors import UsageError
from rlft.logging.run_dir import FollowerRunDirectory, RunDirectory

if TYPE_CHECKING:
    import logging

    from rlft.checkpoint.resume import ResumePoint
    from rlft.config.schema import RunConfig
    from rlft.trainer.job import Job


@dataclass
class ResumePlan:
    """``point``: the checkpoint to continue from (:class:`~rlft.checkpoint.resume.ResumePoint`) or None;
    ``changes``: the harmless config changes, one ``path: old -> new`` each; ``restart_root``: a run
    ``--resume auto`` found that stopped before its first save, to start afresh in place."""

    point: ResumePoint | None = None
    changes: list[str] = field(default_factory=list)
    restart_root: Path | None = None

    @property
    def step(self) -> int | None:
        return int(self.point.state["step"]) if self.point is not None else None


def plan_resume(
    resume_from: str | None, cfg, continuity: dict[str, str], run_dir_path: Path | None, config_source: str, dist: Dist
) -> ResumePlan:
    """The :class:`ResumePlan` of a run started with ``--resume resume_from`` (None: a new run);
    ``continuity``: the job's own rules (dotted path -> why a change breaks the resume)."""
    if not resume_from:
        return ResumePlan()
    from rlft.checkpoint.continuity import COMMON_RULES, schedule_rules
    from rlft.checkpoint.resume import check_continuity, find_checkpoint

    rules = {**COMMON_RULES, **continuity, **schedule_rules(cfg.kind, config_to_dict(cfg))}
    if resume_from == "auto":
        root = auto_resume_root(cfg, run_dir_path, config_source, rules)
        if dist.enabled:  # the run rank 0 found (a run of this config among several, ...)
            root = dist.broadcast_object(root)
        point = find_checkpoint("auto", root) if root is not None else None
        if point is None:
            held = root is not None and RunDirectory(root).holds_run()
            return ResumePlan(restart_root=root if held else None)
    else:
        point = find_checkpoint(resume_from, None)
        assert point is not None  # an explicit checkpoint that is not there is refused, never None
        if run_dir_path is not None and point.run_root != run_dir_path:
            raise UsageError(
                f"--resume {point.checkpoint} belongs to the run {point.run_root}, not to --run-dir {run_dir_path}"
            )
    return ResumePlan(point, check_continuity(point, config_to_dict(cfg), cfg.data.train_file, rules))


def auto_resume_root(cfg, run_dir_path: Path | None, config_source: str, rules: dict[str, str]) -> Path | None:
    """The run directory ``--resume auto`` looks in: --run-dir, ``<output_dir>/<run_name>``, or else
    the run of ``output_dir`` made from this config."""
    from rlft.checkpoint.layout import find_run_of_config

    if run_dir_path is not None:
        return run_dir_path
    output_dir = Path(cfg.train.output_dir).expanduser().resolve()
    if cfg.train.run_name:
        return output_dir / cfg.train.run_name
    return find_run_of_config(output_dir, config_to_dict(cfg), config_source, rules)


def log_plan(plan: ResumePlan, resume_from: str | None, log) -> None:
    """What the plan means, in the run's log (before the model is built)."""
    if plan.point is not None:
        for path, why in plan.point.damaged.items():
            log.warning(
                f"--resume auto: checkpoint {path} is damaged ({why}); continuing from the newest intact "
                f"one, {plan.point.checkpoint.name}"
            )
        for change in plan.changes:
            log.info(f"changed on resume: {change}")
    elif plan.restart_root is not None:
        log.info(
            f"--resume auto: the run in {plan.restart_root} stopped before its first checkpoint; starting it "
            f"afresh in the same directory"
        )
    elif resume_from == "auto":
        log.info("--resume auto: no checkpoint of this run to continue from; starting it afresh")


def set_aside_later_than(run_root: Path, step: int, damaged: dict | None, log) -> None:
    """One timeline: what the run directory holds from after ``step`` (newer checkpoints, log records
    of a process that went further) is moved aside, kept, and logged (:mod:`rlft.checkpoint.aside`)."""
    from rlft.checkpoint.aside import supersede_after

    for line in supersede_after(run_root, step, damaged):
        (log.warning if "damaged" in line else log.info)(line)


def open_run_directory(plan: ResumePlan, cfg: RunConfig, run_dir_path: Path | None, dist: Dist) -> RunDirectory:
    """The run directory for ``plan``: rank 0 creates (or reopens) it and tells the other processes,
    which only read it (:class:`FollowerRunDirectory`)."""
    if plan.point is not None:
        root = plan.point.run_root
        return RunDirectory(root) if dist.is_main else FollowerRunDirectory(root)
    run_dir: RunDirectory | None
    if not dist.is_main:
        run_dir = None
    elif plan.restart_root is not None:
        run_dir = RunDirectory(plan.restart_root)
        run_dir.checkpoints.mkdir(parents=True, exist_ok=True)
        run_dir.eval_dir.mkdir(exist_ok=True)
    elif run_dir_path is not None:
        run_dir = RunDirectory.at(run_dir_path)
    else:
        run_dir = RunDirectory.create(cfg.train.output_dir, cfg.train.run_name, cfg.run_label())
    if not dist.enabled:
        assert run_dir is not None  # one process is rank 0
        return run_dir
    root = dist.broadcast_object(str(run_dir.root) if run_dir is not None else None)
    return run_dir if run_dir is not None else FollowerRunDirectory(Path(root))


def restore_run(point: ResumePoint, job: Job, dist: Dist, run_dir: RunDirectory, log: logging.Logger) -> int:
    """Load ``point``'s training state into the built ``job``; the
    step it continues from. Only once it loaded are the run's later checkpoints set aside, so a resume
    that fails leaves the run directory as it was."""
    from rlft.checkpoint.resume import restore_training_state

    state, settings = job.state(), list[str]()
    step = restore_training_state(
        point,
        model=state.model,
        optimizer=state.optimizer,
        scheduler=state.scheduler,
        sampler=state.sampler,
        components=state.components,
        dist=dist,
        report=settings,
    )
    job.restore(point.state)
    log.info(f"resumed from {point.checkpoint} at step {step}; continuing to step {job.total_steps}")
    for line in settings:
        log.info(f"optimizer settings of this config apply from step {step + 1}: {line}")
    if dist.is_main:
        set_aside_later_than(run_dir.root, step, point.damaged, log)
    return step
