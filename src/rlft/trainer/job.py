"""The seam between the shared run lifecycle and one kind of training job.

:class:`rlft.trainer.trainer.Trainer` owns everything a run has whatever it trains: the run
directory, logs, the progress bar, the step loop, logging / checkpoint / evaluation cadence, exact
resume and ``run.json``. A kind of job (``rl``, ``sft``; registered in
:data:`rlft.config.schema.JOB_KINDS`) contributes what differs: how it builds its parts, one
training step, its evaluation, the extra state its checkpoints carry, and the config changes that
break a resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from rlft.config.schema import RunConfig, TrainConfig
from rlft.logging.run_dir import RunDirectory
from rlft.trainer.generation import GenerationSettings


@dataclass
class EvalRecord:
    """One evaluation: ``result`` (what the API returns, e.g. an ``EvalResult``), the one-line summary
    for the log, and the JSON payload written to ``eval/step-<N>.json``."""

    result: Any
    line: str
    payload: dict


@dataclass
class TrainedState:
    """What a checkpoint must hold for exact resume, beyond the RNG streams the lifecycle saves.

    model/tokenizer: saved in Hugging Face layout; optimizer/scheduler: their state dicts; sampler:
    the data position (``state_dict``/``load_state_dict``); components: further trained parts by
    sub-directory name (each with ``save(dir)``/``load(dir)``); extra: JSON values for
    ``trainer_state.json`` (e.g. the adaptive KL coefficient)."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    components: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    export_model: torch.nn.Module | None = None  # the whole weights when ``model`` is sharded (fsdp2)


class Job(Protocol):
    """One kind of training, run by the lifecycle in this order: ``build()``, then ``train_step()``
    until ``total_steps``, with ``evaluate()`` and ``state()`` at the configured cadence. These are
    all the lifecycle uses; what ``rlft eval`` asks of a job class is :class:`GeneratingKind`."""

    #: Config paths (a prefix covers everything below it) whose change breaks a resume, and why;
    #: added to the rules every kind shares (rlft.checkpoint.continuity.COMMON_RULES).
    CONTINUITY: ClassVar[dict[str, str]]

    total_steps: int
    steps_per_epoch: int
    model_dir: str  # where the trained weights were loaded from (recorded in each checkpoint)

    def build(self, run_dir: RunDirectory) -> None:
        """Load the model and data and build the optimizer; log what was built. ``run_dir`` is where
        the run writes (a job may add files of its own, e.g. RL's samples.jsonl)."""

    def describe(self) -> list[str]:
        """Log lines that say what this run does (algorithm, parameters, batch geometry)."""

    def train_step(self, step: int) -> dict[str, float]:
        """Train step number ``step`` (1-based); returns its metrics."""

    def step_line(self, step: int, metrics: dict[str, float]) -> str:
        """The human-readable log line of a logging step (``metrics`` averaged since the last one)."""

    def progress_info(self) -> str:
        """A few words for the progress bar (e.g. the last reward)."""

    def evaluate(self, step: int, tag: str) -> EvalRecord | None:
        """Held-out evaluation, or None when there is no eval data."""

    def state(self) -> TrainedState:
        """The parts a checkpoint saves."""

    def restore(self, extra: dict[str, Any]) -> None:
        """Take back ``TrainedState.extra`` from a checkpoint (weights, optimizer ... are restored already)."""

    def report(self, before: EvalRecord | None, after: EvalRecord | None) -> list[str]:
        """Closing log lines comparing the evaluations before and after training."""


class GeneratingKind(Protocol):
    """What ``rlft eval`` and ``rlft rollout`` ask of a job class without building a job: the
    held-out prompts a generation evaluation answers, how it generates, and what scores it. The
    lifecycle never calls these; every job class has them (None where a kind does not generate)."""

    @staticmethod
    def eval_prompts(cfg: RunConfig, tokenizer) -> list | None:
        """The held-out prompts (``PromptExample``) the generation evaluation answers, or None."""

    @staticmethod
    def generation(cfg: RunConfig) -> GenerationSettings:
        """How the evaluation generates."""

    @staticmethod
    def reward_manager(cfg: RunConfig):
        """The rewards that score generations (a ``RewardManager``), or None if the kind has none."""


def total_steps(train: TrainConfig, steps_per_epoch: int) -> int:
    """``train.epochs`` passes of ``steps_per_epoch`` steps, capped at ``train.max_steps``."""
    total = train.epochs * steps_per_epoch
    return min(total, train.max_steps) if train.max_steps is not None else total


def job_class(cfg: RunConfig) -> type:
    """The job class of ``cfg.kind`` (imported only now: the lifecycle never imports a kind's code)."""
    import importlib

    from rlft.config.schema import JOB_KINDS

    module, _, name = JOB_KINDS[cfg.kind].job.partition(":")
    return getattr(importlib.import_module(module), name)
