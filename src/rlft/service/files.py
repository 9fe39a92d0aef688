"""Reading a job's files for the API: log tails, metrics by byte offset, samples, evaluations.

Each reader takes the job's own folders from the store (never a path from the request) and
refuses (:class:`OutsideJob`, a 403) any file that resolves outside them or outside the workspace,
so a symlink planted in a run directory (or a run directory that is itself a link) cannot make the
service read elsewhere. JSONL is read by byte offset and only whole lines are returned: a
client that polls (or an SSE stream that reconnects) with the last offset it got misses nothing
and sees nothing twice, even while training is appending.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlft.service.runner import tail_lines

MAX_CHUNK = 4 << 20  # bytes of JSONL returned per call; a client asks again from the next offset


class OutsideJob(Exception):
    """A file the service will not serve; the message names the file, never where its link points."""


def _within(real: Path, base: Path) -> bool:
    return real == base or base in real.parents


def checked(path: Path, roots: tuple[str, ...], workspace: str | None = None) -> Path:
    """The real path of ``path`` if it lies inside one of ``roots`` (and inside ``workspace``, when
    given), whatever links lead there; else :class:`OutsideJob`."""
    real = Path(os.path.realpath(path))
    if workspace is not None and not _within(real, Path(os.path.realpath(workspace))):
        raise OutsideJob(
            f"refused to serve {Path(path).name}: it resolves to a file outside the workspace "
            f"(a symbolic link out of the job's folder)"
        )
    for root in roots:
        if _within(real, Path(os.path.realpath(root))):
            return real
    raise OutsideJob(
        f"refused to serve {Path(path).name}: it resolves to a file outside the job's folders "
        f"(a symbolic link out of them)"
    )


_inside = checked  # the older name


def log_tail(path: str, job_dir: str, lines: int, workspace: str | None = None) -> str:
    return tail_lines(checked(Path(path), (job_dir,), workspace), lines)


def read_jsonl_from(
    path: Path, roots: tuple[str, ...], offset: int = 0, max_bytes: int = MAX_CHUNK, workspace: str | None = None
) -> tuple[list[dict], int, bool]:
    """The complete JSON lines of ``path`` from byte ``offset``, the offset after the last one, and
    whether the file was rewritten under the reader (a resume drops the records written after its
    checkpoint): then ``offset`` no longer falls after a line end, and reading starts again at 0."""
    try:
        real = checked(path, roots, workspace)
        with open(real, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            reset = offset > size or (offset > 0 and _byte_before(f, offset) != b"\n")
            if reset:
                offset = 0
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return [], 0, offset > 0
    end = data.rfind(b"\n")
    if end < 0:  # no complete line yet (or one longer than max_bytes: read it whole)
        return [], offset, reset
    records = []
    for line in data[: end + 1].splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a corrupt line must not hide the rest
    return records, offset + end + 1, reset


def _byte_before(f, offset: int) -> bytes:
    f.seek(offset - 1)
    return f.read(1)


def samples(run_dir: str, last_steps: int = 3, limit: int = 400, workspace: str | None = None) -> list[dict]:
    """The samples of the ``last_steps`` most recent steps, grouped by (step, prompt): a GRPO group
    reads side by side. Each group: step, prompt, completions [{completion, reward, rewards}]."""
    records, _, _ = read_jsonl_from(
        Path(run_dir) / "samples.jsonl", (run_dir,), 0, max_bytes=64 << 20, workspace=workspace
    )
    steps = sorted({r.get("step", 0) for r in records})[-last_steps:]
    groups: dict[tuple, dict] = {}
    for r in records:
        if r.get("step", 0) not in steps:
            continue
        key = (r.get("step", 0), r.get("prompt", ""))
        group = groups.setdefault(key, {"step": key[0], "prompt": key[1], "completions": []})
        group["completions"].append(
            {"completion": r.get("completion", ""), "reward": r.get("reward"), "rewards": r.get("rewards") or {}}
        )
    ordered = sorted(groups.values(), key=lambda g: -g["step"])
    return ordered[:limit]


def evaluations(run_dir: str, workspace: str | None = None) -> list[dict]:
    """Every eval/step-N.json of the run, oldest first, without the per-sample lists (summaries only).
    A report that is a link out of the run is refused (:class:`OutsideJob`), not skipped unseen."""
    out = []
    eval_dir = checked(Path(run_dir) / "eval", (run_dir,), workspace)
    for path in sorted(eval_dir.glob("step-*.json"), key=_step_number):
        real = checked(path, (run_dir,), workspace)
        try:
            data = json.loads(real.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        data.pop("samples", None)
        out.append(data)
    return out


def _step_number(path: Path) -> int:
    tail = path.stem.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1
