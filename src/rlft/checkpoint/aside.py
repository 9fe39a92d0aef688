"""Keeping one timeline in a run directory: what a resume from step N no longer continues is moved aside.

A run resumed from checkpoint-N continues from step N; whatever the run directory holds from after
step N belongs to a timeline that is abandoned (a newer checkpoint, the metrics a killed process
wrote after its last save, an older resume that went further). Left in place, a newer checkpoint
would be picked by the next ``--resume auto`` and the metrics would read 1, 2, 3, 4, 7, 8. Deleting
them would lose work a person may want, so they are moved, never removed:

    <run>/superseded-<UTC time>/checkpoints/checkpoint-6/, metrics.jsonl, samples.jsonl, eval/step-6.json
    <run>/checkpoints/damaged-checkpoint-6/          a checkpoint found damaged (see manifest.py)

Neither name matches ``checkpoint-*``, so :func:`rlft.checkpoint.layout.list_checkpoints` (and the
job service) no longer see them. Torch-free; rank 0 alone calls these.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rlft.atomic import free_name, write_text_atomic
from rlft.checkpoint.layout import is_complete

STEP_LOGS = ("metrics.jsonl", "samples.jsonl")  # the run directory's logs with one record per step or sample


def set_aside_damaged(checkpoint: Path) -> Path:
    """Rename ``checkpoint-N`` to ``damaged-checkpoint-N`` (a free name); returns the new path."""
    aside = free_name(checkpoint.parent / f"damaged-{checkpoint.name}")
    os.rename(checkpoint, aside)
    return aside


def set_aside_incomplete(target: Path) -> Path | None:
    """Before a save to ``target``: a ``checkpoint-N`` folder there without its completion mark is moved
    to ``damaged-checkpoint-N`` instead of being replaced, so whatever is left in it is kept."""
    if not target.is_dir() or is_complete(target):
        return None
    return set_aside_damaged(target)


def checkpoint_dirs(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """Every ``checkpoint-<N>`` folder, complete or not, as (N, path), oldest first."""
    found = []
    for path in checkpoints_dir.glob("checkpoint-*"):
        suffix = path.name.rsplit("-", 1)[-1]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def supersede_after(run_root: Path, step: int, damaged: dict[Path, str] | None = None) -> list[str]:
    """Move aside everything ``run_root`` holds from after ``step``; returns one log line per move.

    ``damaged``: checkpoints known to be damaged (path -> what is wrong), set aside as damaged; an
    incomplete ``checkpoint-M`` (no trainer_state.json) is damaged too."""
    damaged = damaged or {}
    aside = _Aside(run_root)
    lines = []
    for n, path in checkpoint_dirs(run_root / "checkpoints"):
        if n <= step:
            continue
        if path in damaged or not is_complete(path):
            moved = set_aside_damaged(path)
            why = damaged.get(path, "trainer_state.json is missing")
            lines.append(f"checkpoint {path.name} is damaged ({why}); moved to {moved}")
        else:
            moved = aside.move(path, Path("checkpoints") / path.name)
            lines.append(
                f"checkpoint {path.name} is newer than step {step}, where this run continues; moved to "
                f"{moved} (kept, no longer resumed)"
            )
    for name in STEP_LOGS:
        count = _split_jsonl(run_root / name, step, aside)
        if count:
            lines.append(f"{name}: {count} records from after step {step} moved to {aside.root / name}")
    evals = [p for p in (run_root / "eval").glob("step-*.json") if _eval_step(p) is not None and _eval_step(p) > step]
    for path in evals:
        aside.move(path, Path("eval") / path.name)
    if evals:
        lines.append(f"eval: {len(evals)} results from after step {step} moved to {aside.root / 'eval'}")
    return lines


class _Aside:
    """The ``superseded-<time>`` folder of one resume, created on first use."""

    def __init__(self, run_root: Path):
        self.run_root = run_root
        self._root: Path | None = None

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = free_name(self.run_root / f"superseded-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
            self._root.mkdir(parents=True)
        return self._root

    def move(self, path: Path, rel: Path) -> Path:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        return target


def _split_jsonl(path: Path, step: int, aside: _Aside) -> int:
    """Move the records of ``path`` with a step after ``step`` (and a half-written last line) to the same
    name under ``aside``; written there first, so a crash in between loses nothing. Returns how many."""
    if not path.is_file():
        return 0
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    later = [ln for ln in lines if _step_of(ln) is None or _step_of(ln) > step]
    if not later:
        return 0
    target = aside.root / path.name
    with open(target, "a", encoding="utf-8") as f:
        f.write("".join(ln + "\n" for ln in later))
    keep = [ln for ln in lines if not (_step_of(ln) is None or _step_of(ln) > step)]
    write_text_atomic(path, "".join(ln + "\n" for ln in keep))
    return len(later)


def _step_of(line: str) -> int | None:
    """The record's step (0 if it has none), or None for a line that is not a whole JSON object."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    value = record.get("step", 0)
    return value if isinstance(value, int) else 0


def _eval_step(path: Path) -> int | None:
    suffix = path.stem.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else None
