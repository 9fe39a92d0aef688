"""Checkpoints: Hugging Face model (or PEFT adapter) + everything needed to continue the run.

    checkpoint-<N>/
        config.json, model.safetensors, tokenizer files   (or adapter_config.json + adapter_model.safetensors)
        manifest.json          every other file's size and sha256, and whether the optimizer was saved
        trainer_state.json     step, epoch, data position, metrics at save time
        optimizer.pt, scheduler.pt, rng_state.pt
        critic/                PPO only: value_model.pt, optimizer.pt
        config.yaml            the run's resolved config

A checkpoint is written into a hidden temporary directory, fsynced and then
renamed into place (:func:`rlft.atomic.atomic_directory`), so a process killed
mid-write never leaves a directory that looks complete; ``trainer_state.json``
is written last as the completion mark, just after ``manifest.json``
(:mod:`rlft.checkpoint.manifest`), which lets a resume tell damage that came later.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rlft.atomic import atomic_directory
from rlft.checkpoint.aside import set_aside_incomplete
from rlft.checkpoint.layout import STATE_FILE, is_complete, list_checkpoints  # noqa: F401 (re-exported)
from rlft.checkpoint.manifest import write_manifest
from rlft.distributed.context import Dist
from rlft.errors import CheckpointError


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    target: Path,
    *,
    model,
    tokenizer,
    optimizer,
    scheduler,
    trainer_state: dict,
    config_yaml: str,
    components: dict | None = None,
    save_optimizer: bool = True,
    dist: Dist | None = None,
    export_model=None,
) -> Path:
    """Atomically write a checkpoint to ``target``; returns ``target``.

    ``save_optimizer=False`` leaves out optimizer.pt (``train.save_optimizer: false``): an
    export-only checkpoint, a third of the size of a full fine-tune's, that cannot be resumed.

    ``components`` are further trained parts (a PPO critic, ...), each with ``save(directory)``; each
    is written into its own sub-directory of the checkpoint.

    In a data-parallel run (``dist``) every process calls this: the optimizer state goes to the DCP
    directory ``optimizer/`` (each process its shard, :mod:`rlft.distributed.checkpoint`), and rank 0
    alone writes everything else, the weights from ``export_model`` (the whole model; default
    ``model``), and renames the directory into place once every shard is written."""
    from rlft.models.save import save_pretrained_dir

    dist = dist or Dist()
    if dist.is_main:
        set_aside_incomplete(target)
    try:
        with _shared_directory(target, dist) as tmp:
            if save_optimizer and dist.enabled:
                from rlft.distributed.checkpoint import OPTIMIZER_DIR, save_optimizer_shards

                save_optimizer_shards(model, optimizer, tmp / OPTIMIZER_DIR)
            if dist.is_main:
                save_pretrained_dir(export_model if export_model is not None else model, tokenizer, tmp)
                if save_optimizer and not dist.enabled:
                    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                torch.save(rng_state(), tmp / "rng_state.pt")
                (tmp / "config.yaml").write_text(config_yaml)
                for name, part in (components or {}).items():
                    part.save(tmp / name)
                write_manifest(tmp, save_optimizer=save_optimizer)  # lists the optimizer shards too
                (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2))
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
        raise CheckpointError(_not_written(target, exc)) from exc
    dist.barrier()  # nobody reads, prunes or resumes from it before it is in place
    return target


@contextlib.contextmanager
def _shared_directory(target: Path, dist: Dist):
    """Rank 0's atomic temporary directory for ``target``, its path told to every process."""
    if not dist.enabled:
        with atomic_directory(target) as tmp:
            yield tmp
        return
    if dist.is_main:
        with atomic_directory(target) as tmp:
            dist.broadcast_object(str(tmp))
            yield tmp
    else:
        yield Path(dist.broadcast_object(None))


def _not_written(target: Path, exc: BaseException) -> str:
    free = shutil.disk_usage(target.parent).free if target.parent.exists() else None
    reason = (
        f"the disk is full ({free / 2**20:.0f} MB free)"
        if free is not None and free < 2**30
        else f"{type(exc).__name__}: {exc}"
    )
    kept = [p.name for p in list_checkpoints(target.parent)]
    return (
        f"could not write checkpoint {target.name} to {target.parent}: {reason}. "
        + (f"The earlier checkpoints are intact (newest: {kept[-1]}); " if kept else "")
        + "free space (or set train.keep_last) and continue with --resume."
    )


def prune_checkpoints(checkpoints_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints; returns the deleted ones.

    Called only after a save completed, so the newest complete checkpoint is never at risk; a
    half-written ``.tmp-checkpoint-N`` is not a checkpoint and is left to the next save to replace."""
    found = list_checkpoints(checkpoints_dir)
    doomed = found[:-keep_last] if keep_last > 0 else []
    for path in doomed:
        # Renamed first (atomic), so a crash mid-delete never leaves a complete-looking partial checkpoint.
        trash = path.parent / f".tmp-delete-{path.name}"
        os.rename(path, trash)
        shutil.rmtree(trash)
    return doomed
