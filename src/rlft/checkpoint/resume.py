"""Continuing a run from a checkpoint: find it, restore weights and training state."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlft.checkpoint.aside import checkpoint_dirs
from rlft.checkpoint.continuity import compare_configs, file_fingerprint
from rlft.checkpoint.io import set_rng_state
from rlft.checkpoint.layout import STATE_FILE, has_optimizer_state
from rlft.checkpoint.manifest import checkpoint_problems, optimizer_saved
from rlft.config.yamlio import load_yaml_text
from rlft.distributed.context import Dist
from rlft.errors import UsageError


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path
    run_root: Path
    state: dict
    # Newer checkpoints ``--resume auto`` passed over because they are damaged: path -> what is wrong.
    damaged: dict = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.state["step"])


def find_checkpoint(resume: str, run_root: Path | None) -> ResumePoint | None:
    """``resume`` is a checkpoint directory or 'auto': the newest intact checkpoint of ``run_root``.

    'auto' passes over damaged checkpoints (recorded in ``ResumePoint.damaged``, for the log and to be
    set aside), and gives None when ``run_root`` holds no checkpoint at all: no run there yet, or one
    stopped before its first save; either starts afresh, so a relaunch loop that always passes
    --resume auto works from the first launch on. A run whose checkpoints are all damaged is refused
    (starting again would hide the loss). An explicit directory that is damaged is refused, naming
    the file."""
    if resume == "auto":
        if run_root is None:
            raise UsageError("--resume auto needs a run directory to look in")
        path, damaged = _newest_intact(run_root / "checkpoints")
        if path is None:
            return None
    else:
        path, damaged = Path(resume).expanduser().resolve(), {}
        problems = checkpoint_problems(path)
        if problems:
            what = (
                "is not a complete checkpoint directory"
                if not (path / STATE_FILE).is_file()
                else "is a damaged checkpoint"
            )
            raise UsageError(f"--resume {resume}: {path} {what}: {'; '.join(problems)}. " + _intact_hint(path))
    _check_optimizer_state(path)
    state = json.loads((path / STATE_FILE).read_text())
    return ResumePoint(checkpoint=path, run_root=path.parent.parent, state=state, damaged=damaged)


def _newest_intact(checkpoints_dir: Path) -> tuple[Path | None, dict]:
    """The newest checkpoint that passes :func:`checkpoint_problems`, and the damaged ones newer than it."""
    damaged = {}
    for _, path in reversed(checkpoint_dirs(checkpoints_dir)):
        problems = checkpoint_problems(path)
        if not problems:
            return path, damaged
        damaged[path] = "; ".join(problems)
    if damaged:
        lines = "\n".join(f"  - {p.name}: {why}" for p, why in damaged.items())
        raise UsageError(
            f"--resume auto: no intact checkpoint under {checkpoints_dir}; every one is damaged:\n"
            f"{lines}\nRestore the files, or start the run again without --resume (another "
            f"train.run_name) so nothing here is overwritten"
        )
    return None, damaged


def _intact_hint(path: Path) -> str:
    intact = [p.name for _, p in checkpoint_dirs(path.parent) if p != path and not checkpoint_problems(p, hashes=False)]
    return (
        f"Resume from an intact one ({', '.join(intact)}) or with --resume auto, which takes the newest "
        f"intact checkpoint"
        if intact
        else "No other checkpoint of this run looks intact"
    )


def _check_optimizer_state(path: Path) -> None:
    """Refuse a checkpoint without optimizer state, saying why: the manifest tells an export-only save
    (``train.save_optimizer: false``) from a lost file; an older checkpoint cannot tell."""
    if has_optimizer_state(path):
        return
    saved = optimizer_saved(path)
    if saved:
        raise UsageError(f"--resume {path}: checkpoint {path} is damaged: its optimizer state is missing")
    how = (
        "it was saved with train.save_optimizer: false, an export-only checkpoint"
        if saved is False
        else "optimizer.pt is missing; this checkpoint predates manifests, so whether it was saved with "
        "train.save_optimizer: false (export-only) or the file was lost cannot be told"
    )
    raise UsageError(
        f"--resume {path}: this checkpoint has no optimizer state ({how}), so the run cannot "
        f"continue exactly. Start a new run from its weights with model.path: {path}"
    )


def check_continuity(point: ResumePoint, new_config: dict, train_file: str, rules: dict[str, str]) -> list[str]:
    """Refuse (UsageError) to continue ``point`` under a config that breaks continuity (``rules``: dotted
    path -> why); returns the harmless changes, one ``path: old -> new`` line each, for the log."""
    path = point.checkpoint / "config.yaml"
    saved = load_yaml_text(path.read_text(), str(path))
    saved.setdefault("kind", "rl")  # checkpoints from before there were several kinds of job
    breaking, harmless = compare_configs(saved, new_config, rules)
    saved_print = point.state.get("data_fingerprint")
    if saved_print and Path(train_file).is_file() and file_fingerprint(train_file) != saved_print:
        breaking.append(
            f"data.train_file: {train_file} has other contents than when {point.checkpoint.name} was "
            f"saved (the data order and position refer to the original rows)"
        )
    if breaking:
        lines = "\n".join(f"  - {b}" for b in breaking)
        raise UsageError(
            f"cannot resume {point.checkpoint} with this config; it changes what the checkpoint "
            f"means:\n{lines}\nResume with the original values, or start a new run "
            f"(another train.run_name) from the checkpoint's weights with model.path: {point.checkpoint}"
        )
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


def restore_training_state(
    point: ResumePoint,
    *,
    model,
    optimizer,
    scheduler,
    sampler,
    components: dict | None = None,
    dist: Dist | None = None,
    report: list[str] | None = None,
) -> int:
    """Weights, optimizer, scheduler, further components (each with ``load(directory)``), data position
    and RNG; returns the step to continue from. A checkpoint saved at any number of processes
    resumes at any other (``dist``: this run's; :mod:`rlft.distributed.checkpoint`).

    The optimizer's settings (learning rate, weight decay, betas, eps) are this config's, not the
    saved ones: loading a state dict brings back the old values, and a changed learning rate that
    is logged must also be the one the steps use. ``report`` gets one line per setting that differs."""
    from rlft.distributed.checkpoint import load_optimizer, load_sharded_weights
    from rlft.distributed.strategy import strategy_of

    dist = dist or Dist()
    ck = point.checkpoint
    with _reading(
        ck, "model.safetensors" if not (ck / "adapter_model.safetensors").is_file() else "adapter_model.safetensors"
    ):
        load_sharded_weights(model, ck) if strategy_of(dist).shards else load_weights(model, ck)
    for name, part in (components or {}).items():
        if not (ck / name).is_dir():
            raise UsageError(
                f"checkpoint {ck} has no {name}/ directory, but this run has a {name}; "
                f"was it saved by a run with another algorithm?"
            )
        part_optimizer = getattr(part, "optimizer", None)
        configured = optimizer_settings(part_optimizer) if part_optimizer is not None else None
        with _reading(ck, f"{name}/"):
            part.load(ck / name)
        if configured is not None:
            _note(report, f"{name}: ", apply_optimizer_settings(part_optimizer, configured))
    configured, base_lrs = optimizer_settings(optimizer), list(getattr(scheduler, "base_lrs", []))
    with _reading(ck, "optimizer state"):
        load_optimizer(model, optimizer, ck, dist)
    with _reading(ck, "scheduler.pt"):
        scheduler.load_state_dict(torch.load(ck / "scheduler.pt", weights_only=False))
    _note(report, "", apply_optimizer_settings(optimizer, configured, scheduler, base_lrs))
    sampler.load_state_dict(point.state["sampler"])
    # Last, so nothing built above consumes random numbers the continued run expects.
    with _reading(ck, "rng_state.pt"):
        set_rng_state(torch.load(ck / "rng_state.pt", weights_only=False))
    return int(point.state["step"])


# The optimizer settings a config sets; a param group's "initial_lr" is the peak its schedule scales.
SETTINGS = ("initial_lr", "weight_decay", "betas", "eps")


def optimizer_settings(optimizer) -> list[dict]:
    """Each param group's configured settings and learning rate, taken before a state dict overwrites them."""
    return [{k: g[k] for k in (*SETTINGS, "lr") if k in g} for g in optimizer.param_groups]


def apply_optimizer_settings(optimizer, configured: list[dict], scheduler=None, base_lrs=None) -> list[str]:
    """Put ``configured`` (:func:`optimizer_settings` of the freshly built optimizer) back after loading
    a checkpoint; returns ``name old -> new`` for each setting that differed.

    With a LambdaLR ``scheduler``, its peaks (``base_lrs``) become this config's and the current
    learning rate is recomputed from its (this config's) schedule at the restored position, so the
    schedule continues with the new peak, warm-up and shape. Unchanged settings give the same numbers
    bit for bit (the same product LambdaLR computes)."""
    changed = []
    for group, fresh in zip(optimizer.param_groups, configured):
        for key in SETTINGS:
            if key in fresh and group.get(key) != fresh[key]:
                changed.append(f"{'peak lr' if key == 'initial_lr' else key} {group.get(key)} -> {fresh[key]}")
                group[key] = fresh[key]
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is not None and base_lrs:
        scheduler.base_lrs = list(base_lrs)
        lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(base_lrs, lambdas)]
    else:
        lrs = [fresh["lr"] for fresh in configured]  # no schedule: the configured rate itself
    for group, lr in zip(optimizer.param_groups, lrs):
        if group["lr"] != lr:
            changed.append(f"lr {group['lr']:g} -> {lr:g}")
            group["lr"] = lr
    if scheduler is not None and hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return list(dict.fromkeys(changed))


def _note(report: list[str] | None, prefix: str, changes: list[str]) -> None:
    if report is not None and changes:
        report.append(prefix + ", ".join(changes))


@contextlib.contextmanager
def _reading(checkpoint: Path, what: str):
    """Turn a failure to read ``what`` of ``checkpoint`` (truncated, missing, not what torch or
    safetensors expects) into a UsageError naming both, instead of a library traceback."""
    try:
        yield
    except UsageError:
        raise
    except Exception as exc:  # SafetensorError, UnpicklingError, EOFError, OSError, RuntimeError ...
        if not _is_read_failure(exc):
            raise
        raise UsageError(
            f"checkpoint {checkpoint} is damaged: reading {what} failed "
            f"({type(exc).__name__}: {str(exc)[:300]}). Resume from an earlier checkpoint, or with "
            f"--resume auto"
        ) from exc


def _is_read_failure(exc: BaseException) -> bool:
    import pickle

    names = {"SafetensorError", "HeaderTooLarge", "InvalidHeaderDeserialization"}
    return (
        isinstance(exc, (OSError, EOFError, pickle.UnpicklingError, RuntimeError, ValueError, KeyError))
        or type(exc).__name__ in names
    )
