"""What a run will write to disk: its checkpoints, from the model's shape and the save settings.

A full fine-tune's checkpoint holds the fp32 weights (4 bytes a parameter) and AdamW's two fp32
moments (8 bytes a trained parameter, two thirds of it, left out with ``train.save_optimizer:
false``); a LoRA checkpoint holds only the adapter and its moments. Logs are small beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlft.planner.kinds import separate_critic
from rlft.planner.shape import ModelShape

LOG_BYTES = 64 * 2**20  # metrics, samples, resources and the text log of a long run, generously


@dataclass(frozen=True)
class DiskPlan:
    """checkpoint_bytes: one checkpoint; kept: how many exist at most at once; best_bytes: the best
    evaluation's model (train.save_best), else 0; total: all of it."""

    checkpoint_bytes: int
    kept: int
    best_bytes: int = 0

    @property
    def total(self) -> int:
        return self.checkpoint_bytes * self.kept + self.best_bytes + LOG_BYTES


def checkpoint_bytes(cfg, shape: ModelShape, *, save_optimizer: bool | None = None) -> int:
    """One checkpoint's bytes; ``save_optimizer`` None: as ``train.save_optimizer`` says."""
    lora = cfg.model.lora is not None
    weights = 4 * (shape.trainable if lora else shape.params)
    keeps_optimizer = cfg.train.save_optimizer if save_optimizer is None else save_optimizer
    optimizer = 8 * shape.trainable if keeps_optimizer else 0
    critic = 12 * shape.params if separate_critic(getattr(cfg, "algorithm", None)) else 0
    return weights + optimizer + critic


def disk_plan(cfg, shape: ModelShape, total_steps: int | None) -> DiskPlan:
    """The checkpoints a run of ``total_steps`` steps keeps (one every ``train.save_interval`` and one at
    the end, at most ``train.keep_last``); ``total_steps`` None counts the newest one only."""
    saves = 1 if total_steps is None else math.ceil(total_steps / cfg.train.save_interval)
    kept = min(saves, cfg.train.keep_last) if cfg.train.keep_last else saves
    best = checkpoint_bytes(cfg, shape, save_optimizer=False) if cfg.train.save_best else 0
    return DiskPlan(checkpoint_bytes(cfg, shape), max(kept, 1), best)


def planned_steps(cfg) -> int | None:
    """The run's step count: epochs over the training rows at the kind's batch size, capped at
    ``train.max_steps``; None when the data cannot be read (the run will say why)."""
    from rlft.data.readers import read_rows
    from rlft.errors import DataError

    sections = [getattr(cfg, name) for name in type(cfg).model_fields if name != "eval"]
    batch = next(
        (getattr(sec, attr) for attr in ("rollout_batch_size", "batch_size") for sec in sections if hasattr(sec, attr)),
        1,
    )  # prompts per RL step, else rows (pairs) per optimizer step
    try:
        rows = len(read_rows(cfg.data.train_file, on_bad_row="skip").rows)
    except DataError:
        return cfg.train.max_steps
    steps = cfg.train.epochs * max(1, math.ceil(rows / batch))
    return min(steps, cfg.train.max_steps) if cfg.train.max_steps else steps
