"""The run directory: every file a run writes lives under one folder with a fixed layout.

    <output_dir>/<run_name>/
        config.yaml          resolved configuration
        train_log.log        human-readable log (the console lines)
        metrics.jsonl        one JSON object per logging step
        samples.jsonl        prompts, completions and rewards
        eval/step-<N>.json   evaluation results
        checkpoints/checkpoint-<N>/
        run.json             run id, status, pid, heartbeat, timestamps (read by the job service)

run.json's ``status`` is ``starting``, ``running``, then one of ``completed``, ``failed`` (with
``error`` and ``error_type``) or ``cancelled`` (a stop request: SIGTERM or Ctrl-C, after a final
checkpoint). ``heartbeat`` is refreshed every few seconds while the process lives; ``progress`` is
the time the last step completed (or the current phase began), which a hung step stops advancing
(the job service reports such a run as stalled: :mod:`rlft.service.stall`).

Every write here reports a full disk as one :class:`~rlft.errors.DiskFullError` naming the file;
run.json is replaced atomically, so a failed write leaves its last complete version.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rlft.atomic import check_writable, reporting_disk_full, write_text_atomic

CLAIM = ".rlft-run"  # created exclusively by the run that takes the directory
_INFO_LOCK = threading.Lock()  # run.json is read-modify-written by the loop and the heartbeat thread


@dataclass(frozen=True)
class RunDirectory:
    root: Path

    @classmethod
    def create(cls, output_dir: str | Path, run_name: str | None, algorithm: str) -> RunDirectory:
        """A new run directory. If ``<output_dir>/<run_name>`` already holds a run (or another run starting
        at the same moment took it), ``-2``, ``-3`` ... is appended instead: a fresh run never mixes its
        files with another's (continuing one is --resume)."""
        name = run_name or time.strftime("%Y%m%d-%H%M%S") + f"-{algorithm}"
        check_writable(Path(output_dir).expanduser(), "train.output_dir")  # before any model is loaded
        base = Path(output_dir).expanduser().resolve() / name
        root, n = base, 1
        while cls(root).holds_run() or not _claim(root):
            n += 1
            root = base.with_name(f"{name}-{n}")
        return cls.at(root)

    @classmethod
    def at(cls, root: str | Path) -> RunDirectory:
        """The run directory exactly at ``root`` (the job service names it before the process starts);
        refused if it already holds a run (continuing one is --resume)."""
        run = cls(Path(root).expanduser().resolve())
        if run.holds_run():
            from rlft.errors import UsageError

            raise UsageError(
                f"--run-dir {run.root} already holds a run; continue it with --resume auto, or choose another directory"
            )
        check_writable(run.root, "the run directory")
        (run.root / "checkpoints").mkdir(exist_ok=True)
        (run.root / "eval").mkdir(exist_ok=True)
        return run

    config = property(lambda self: self.root / "config.yaml")
    log = property(lambda self: self.root / "train_log.log")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    samples = property(lambda self: self.root / "samples.jsonl")
    checkpoints = property(lambda self: self.root / "checkpoints")
    eval_dir = property(lambda self: self.root / "eval")
    run_info = property(lambda self: self.root / "run.json")

    def holds_run(self) -> bool:
        return self.metrics.exists() or self.run_info.exists() or any(self.checkpoints.glob("checkpoint-*"))

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"checkpoint-{step}"

    @property
    def best(self) -> Path:
        """checkpoints/best: the best evaluation's model (train.save_best); not a checkpoint-<N>, so it is
        never pruned by keep_last nor resumed from."""
        return self.checkpoints / "best"

    def best_accuracy(self, step: int) -> float | None:
        """The accuracy checkpoints/best was saved with, if it was saved at ``step`` or before (a run resumed
        from an earlier checkpoint does not compete with a model from the steps it replays)."""
        try:
            state = json.loads((self.best / "trainer_state.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("step", step + 1) > step:
            return None
        accuracy = state.get("accuracy")
        return float(accuracy) if isinstance(accuracy, (int, float)) else None

    def write_config(self, text: str) -> None:
        """config.yaml: the config in effect."""
        write_text_atomic(self.config, text)

    def write_eval_report(self, step: int, report: dict) -> None:
        """eval/step-<step>.json, written whole or not at all."""
        write_text_atomic(self.eval_dir / f"step-{step}.json", json.dumps(report, indent=2, ensure_ascii=False))

    def write_run_info(self, **fields) -> None:
        """Merge ``fields`` into run.json atomically (a reader never sees half a file)."""
        with _INFO_LOCK:
            info = self.read_run_info()
            info.setdefault("run_id", uuid.uuid4().hex[:12])
            info.update(fields)
            write_text_atomic(self.run_info, json.dumps(info, indent=2))

    def read_run_info(self) -> dict:
        """run.json as a dict ({} when there is none yet)."""
        try:
            return json.loads(self.run_info.read_text())
        except FileNotFoundError:
            return {}


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON object as a line and flush, so a crash loses at most the current line. A full
    disk is a :class:`~rlft.errors.DiskFullError` naming ``path``."""
    with reporting_disk_full(path), open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Drop the records with ``step`` > max_step (written after the checkpoint a run resumes from, by the
    process that crashed), and a half-written line the crash left; rewritten atomically. Returns how
    many were dropped."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    steps = [(ln, _step_of(ln)) for ln in lines if ln.strip()]
    keep = [ln for ln, step in steps if step is not None and step <= max_step]
    dropped = sum(1 for ln in lines if ln.strip()) - len(keep)
    if dropped:
        write_text_atomic(path, "".join(ln + "\n" for ln in keep))
    return dropped


def _step_of(line: str) -> int | None:
    """The record's step (0 if it has none), or None for a line that is not a whole JSON object."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("step", 0) if isinstance(record, dict) else None


class FollowerRunDirectory(RunDirectory):
    """The run directory as a process other than rank 0 of a data-parallel run sees it: the same
    paths, to read checkpoints from, but run.json is rank 0's to write."""

    def write_config(self, text: str) -> None:
        """config.yaml: the config in effect."""
        write_text_atomic(self.config, text)

    def write_eval_report(self, step: int, report: dict) -> None:
        """eval/step-<step>.json, written whole or not at all."""
        write_text_atomic(self.eval_dir / f"step-{step}.json", json.dumps(report, indent=2, ensure_ascii=False))

    def write_run_info(self, **fields) -> None:
        pass


def _claim(root: Path) -> bool:
    """Take ``root`` for a new run, or False if a live run took it first: two runs started in the same
    second (or with the same run_name) both find it free, and only one may create its claim file. A
    claim left by a process that has ended (a run that failed before it began) is taken over."""
    root.mkdir(parents=True, exist_ok=True)
    claim = root / CLAIM
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            owner = int(claim.read_text().strip() or 0)
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            return False
        claim.write_text(str(os.getpid()))
        return True
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
