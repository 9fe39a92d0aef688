"""Continuing a run from a checkpoint: find it, restore weights and training state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from rlft.checkpoint.continuity import compare_configs, file_fingerprint
from rlft.checkpoint.io import set_rng_state
from rlft.checkpoint.layout import STATE_FILE, has_optimizer_state, is_complete, list_checkpoints
from rlft.distributed.context import Dist
from rlft.errors import UsageError
from rlft.logging.run_dir import RunDirectory


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path
    run_root: Path
    state: dict


def find_checkpoint(resume: str, run_root: Path | None) -> ResumePoint | None:
    """``resume`` is a checkpoint directory or 'auto': the latest complete checkpoint of ``run_root``.

    'auto' gives None when there is no run at ``run_root`` yet (the first launch of a job that is
    relaunched with --resume auto starts afresh), and refuses a run there that has no complete
    checkpoint (a restart from scratch would hide that the run was lost)."""
    if resume == "auto":
        if run_root is None:
            raise UsageError("--resume auto needs a run directory to look in")
        found = list_checkpoints(run_root / "checkpoints")
        if not found:
            if not RunDirectory(run_root).holds_run():
                return None
            raise UsageError(f"--resume auto: no complete checkpoint under {run_root / 'checkpoints'}; the run "
                             f"there stopped before its first save. Start it again without --resume")
        path = found[-1]
    else:
        path = Path(resume).expanduser().resolve()
        if not is_complete(path):
            raise UsageError(f"--resume {resume}: not a complete checkpoint directory (no {STATE_FILE}); "
                             f"an interrupted save leaves only a hidden .tmp-checkpoint-N folder")
    if not has_optimizer_state(path):
        raise UsageError(f"--resume {path}: this checkpoint has no optimizer state (it was saved with "
                         f"train.save_optimizer: false, an export-only checkpoint), so the run cannot continue "
                         f"exactly. Start a new run from its weights with model.path: {path}")
    state = json.loads((path / STATE_FILE).read_text())
    return ResumePoint(checkpoint=path, run_root=path.parent.parent, state=state)


def check_continuity(point: ResumePoint, new_config: dict, train_file: str, rules: dict[str, str]) -> list[str]:
    """Refuse (UsageError) to continue ``point`` under a config that breaks continuity (``rules``: dotted
    path -> why); returns the harmless changes, one ``path: old -> new`` line each, for the log."""
    saved = yaml.safe_load((point.checkpoint / "config.yaml").read_text())
    saved.setdefault("kind", "rl")  # checkpoints from before there were several kinds of job
    breaking, harmless = compare_configs(saved, new_config, rules)
    saved_print = point.state.get("data_fingerprint")
    if saved_print and Path(train_file).is_file() and file_fingerprint(train_file) != saved_print:
        breaking.append(f"data.train_file: {train_file} has other contents than when {point.checkpoint.name} was "
                        f"saved (the data order and position refer to the original rows)")
    if breaking:
        lines = "\n".join(f"  - {b}" for b in breaking)
        raise UsageError(f"cannot resume {point.checkpoint} with this config; it changes what the checkpoint "
                         f"means:\n{lines}\nResume with the original values, or start a new run "
                         f"(another train.run_name) from the checkpoint's weights with model.path: {point.checkpoint}")
    return harmless


def load_weights(model, checkpoint: Path) -> None:
    """Load the checkpoint's trainable weights into ``model`` in place (full model or LoRA adapter)."""
    from safetensors.torch import load_file

    adapter = checkpoint / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(adapter)))
        unexpected = getattr(result, "unexpected_keys", [])
    else:
        state = load_file(str(checkpoint / "model.safetensors"))
        result = model.load_state_dict(state, strict=False)
        unexpected = result.unexpected_keys
        tied = {k for k in result.missing_keys if k.endswith("lm_head.weight")}
        missing = [k for k in result.missing_keys if k not in tied]
        if missing:
            raise UsageError(f"checkpoint {checkpoint} does not match the model: missing {missing[:5]}")
    if unexpected:
        raise UsageError(f"checkpoint {checkpoint} does not match the model: unexpected {list(unexpected)[:5]}")


def restore_training_state(point: ResumePoint, *, model, optimizer, scheduler, sampler,
                           components: dict | None = None, dist: Dist | None = None) -> int:
    """Weights, optimizer, scheduler, further components (each with ``load(directory)``), data position
    and RNG; returns the step to continue from. A checkpoint saved at any number of processes
    resumes at any other (``dist``: this run's; :mod:`rlft.distributed.checkpoint`)."""
    from rlft.distributed.checkpoint import load_optimizer, load_sharded_weights

    dist = dist or Dist()
    ck = point.checkpoint
    if dist.strategy == "fsdp2":
        load_sharded_weights(model, ck)
    else:
        load_weights(model, ck)
    for name, part in (components or {}).items():
        if not (ck / name).is_dir():
            raise UsageError(f"checkpoint {ck} has no {name}/ directory, but this run has a {name}; "
                             f"was it saved by a run with another algorithm?")
        part.load(ck / name)
    load_optimizer(model, optimizer, ck, dist)
    scheduler.load_state_dict(torch.load(ck / "scheduler.pt", weights_only=False))
    sampler.load_state_dict(point.state["sampler"])
    # Last, so nothing built above consumes random numbers the continued run expects.
    set_rng_state(torch.load(ck / "rng_state.pt", weights_only=False))
    return int(point.state["step"])
