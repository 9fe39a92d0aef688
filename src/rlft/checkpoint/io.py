"""Checkpoints: Hugging Face model (or PEFT adapter) + everything needed to continue the run.

    checkpoint-<N>/
        config.json, model.safetensors, tokenizer files   (or adapter_config.json + adapter_model.safetensors)
        trainer_state.json     step, epoch, data position, metrics at save time
        optimizer.pt, scheduler.pt, rng_state.pt
        critic/                PPO only: value_model.pt, optimizer.pt
        config.yaml            the run's resolved config

A checkpoint is written into a hidden temporary directory, fsynced and then
renamed into place (:func:`rlft.atomic.atomic_directory`), so a process killed
mid-write never leaves a directory that looks complete; ``trainer_state.json``
is written last as the completion mark.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rlft.atomic import atomic_directory
from rlft.checkpoint.layout import STATE_FILE, is_complete, list_checkpoints  # noqa: F401 (re-exported)
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


def save_checkpoint(target: Path, *, model, tokenizer, optimizer, scheduler, trainer_state: dict,
                    config_yaml: str, components: dict | None = None, save_optimizer: bool = True) -> Path:
    """Atomically write a checkpoint to ``target``; returns ``target``.

    ``save_optimizer=False`` leaves out optimizer.pt (``train.save_optimizer: false``): an
    export-only checkpoint, a third of the size of a full fine-tune's, that cannot be resumed.

    ``components`` are further trained parts (a PPO critic, ...), each with ``save(directory)``; each
    is written into its own sub-directory of the checkpoint."""
    from rlft.models.save import save_pretrained_dir

    try:
        with atomic_directory(target) as tmp:
            save_pretrained_dir(model, tokenizer, tmp)
            if save_optimizer:
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(rng_state(), tmp / "rng_state.pt")
            (tmp / "config.yaml").write_text(config_yaml)
            for name, part in (components or {}).items():
                part.save(tmp / name)
            (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2))
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as a RuntimeError
        raise CheckpointError(_not_written(target, exc)) from exc
    return target


def _not_written(target: Path, exc: BaseException) -> str:
    free = shutil.disk_usage(target.parent).free if target.parent.exists() else None
    reason = (f"the disk is full ({free / 2**20:.0f} MB free)" if free is not None and free < 2**30
              else f"{type(exc).__name__}: {exc}")
    kept = [p.name for p in list_checkpoints(target.parent)]
    return (f"could not write checkpoint {target.name} to {target.parent}: {reason}. "
            + (f"The earlier checkpoints are intact (newest: {kept[-1]}); " if kept else "")
            + "free space (or set train.keep_last) and continue with --resume.")


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
