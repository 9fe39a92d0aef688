"""From a submission (a config file in the workspace, or an inline config) to a queued job.

Everything is checked before anything is read or written: the config is validated as ``rlft validate``
would (the same dotted-path problem list), and :func:`admit`, which every route passes through (a new
submission, its overrides, a resume with its overrides), checks every file, folder, code reference and
URL the config names against the workspace. The run directory the job will write is fixed here and
checked too, so the API can answer with it at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rlft.checkpoint.continuity import COMMON_RULES
from rlft.checkpoint.layout import find_run_of_config, is_complete, list_checkpoints
from rlft.checkpoint.manifest import checkpoint_problems
from rlft.config.loader import config_to_yaml, load_config
from rlft.config.schema import JOB_KINDS
from rlft.config.yamlio import load_yaml_text
from rlft.errors import ConfigError
from rlft.logging.run_dir import RunDirectory
from rlft.service.store import Job, JobStore, NewJob
from rlft.service.workspace import PathRefused, Workspace


class Refused(Exception):
    """A submission the service will not run: ``status`` is the HTTP status (422 invalid, 409
    conflict, 404 unknown), ``problems`` one line each (the message itself when it is the one problem)."""

    def __init__(self, status: int, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.status, self.message, self.problems = status, message, list(problems or [message])


@dataclass
class Submission:
    config_path: str | None = None
    config: dict | None = None
    overrides: list[str] | None = None
    resume_from: str | None = None


def admit(ws: Workspace, cfg) -> None:
    """The one gate of every route: refuse (422, one line per problem) a config that names anything
    outside the workspace (:meth:`Workspace.check_config`)."""
    problems = ws.check_config(cfg)
    if problems:
        raise Refused(422, "the config names paths outside the workspace", problems)


def submit(store: JobStore, ws: Workspace, sub: Submission, submitted_by: str | None = None) -> Job:
    cfg, source = _load(ws, sub)
    admit(ws, cfg)
    resolved = load_yaml_text(config_to_yaml(cfg), "the resolved config")
    output_dir = _inside(ws, cfg.train.output_dir, "train.output_dir")
    job_id = store.new_id()
    run_dir, resume = _run_dir_and_resume(store, ws, cfg, resolved, source, output_dir, job_id, sub.resume_from)
    return _queue(store, ws, job_id, cfg, source, run_dir, resume, None, submitted_by)


def resume_job(
    store: JobStore, ws: Workspace, old: Job, overrides: list[str] | None, submitted_by: str | None = None
) -> Job:
    """A new job continuing ``old`` (failed or cancelled) in its run directory, from its newest intact
    checkpoint (or afresh in place, when it stopped before its first save); ``overrides``
    (``train.max_steps=20``) may change what a resume allows to change."""
    if old.status not in ("failed", "cancelled"):
        raise Refused(409, f"job {old.id} is {old.status}; only a failed or cancelled job can be resumed")
    point = _resume_point(Path(old.run_dir))
    if point is None:
        raise Refused(409, f"job {old.id} left no run in {old.run_dir}; submit it again instead")
    _no_active_job_in(store, old.run_dir)
    try:
        cfg = load_config(
            data=load_yaml_text(old.config_yaml, f"job {old.id}'s config"),
            overrides=overrides,
            base_dir=ws.root,
            kind=old.kind,
        )
    except ConfigError as exc:
        raise Refused(422, str(exc).splitlines()[0], exc.problems) from None
    admit(ws, cfg)
    return _queue(store, ws, store.new_id(), cfg, old.config_source, Path(old.run_dir), point, old.id, submitted_by)


def _load(ws: Workspace, sub: Submission):
    if (sub.config_path is None) == (sub.config is None):
        raise Refused(422, "give exactly one of config_path (a YAML file in the workspace) and config (an object)")
    try:
        if sub.config_path is not None:
            path = ws.resolve(sub.config_path, "config_path")
            if not _is_file(path):
                raise Refused(422, f"config_path: no such file in the workspace: {sub.config_path}")
            source = str(path.relative_to(ws.root))
            return load_config(path, overrides=sub.overrides, base_dir=ws.root), source
        return load_config(data=sub.config, overrides=sub.overrides, base_dir=ws.root), "<inline>"
    except PathRefused as exc:
        raise Refused(422, str(exc), [str(exc)]) from None
    except ConfigError as exc:
        raise Refused(422, str(exc).splitlines()[0], exc.problems) from None


def _run_dir_and_resume(
    store, ws, cfg, resolved, source, output_dir: Path, job_id: str, resume_from: str | None
) -> tuple[Path, str | None]:
    """The run directory the job writes, and the checkpoint it continues from (None: a new run)."""
    if resume_from is None:
        name = cfg.train.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.run_label()}-{job_id[:6]}"
        run_dir = _inside(ws, str(output_dir / name), "train.run_name")
        if RunDirectory(run_dir).holds_run():
            raise Refused(
                409,
                f"train.run_name: {run_dir} already holds a run; resume it (resume_from: auto) or "
                f"choose another run_name",
            )
        _no_active_job_in(store, str(run_dir))
        return run_dir, None
    if resume_from == "auto":
        rules = {**COMMON_RULES, **JOB_KINDS[cfg.kind].continuity}
        root = (
            _inside(ws, str(output_dir / cfg.train.run_name), "train.run_name")
            if cfg.train.run_name
            else find_run_of_config(output_dir, resolved, source, rules)
        )
        point = _resume_point(root) if root is not None else None
        if point is None:
            return _run_dir_and_resume(store, ws, cfg, resolved, source, output_dir, job_id, None)
        _no_active_job_in(store, str(root))
        return root, point
    else:
        checkpoint = _inside(ws, resume_from, "resume_from")
        if not is_complete(checkpoint):
            raise Refused(422, f"resume_from: {resume_from} is not a complete checkpoint directory")
        damage = checkpoint_problems(checkpoint, hashes=False)
        if damage:
            raise Refused(422, f"resume_from: {resume_from} is damaged", [f"resume_from: {p}" for p in damage])
    _no_active_job_in(store, str(checkpoint.parent.parent))
    return checkpoint.parent.parent, str(checkpoint)


def _resume_point(run_dir: Path) -> str | None:
    """What a job continuing the run in ``run_dir`` resumes from: its newest intact checkpoint (sizes
    checked against the manifest; the trainer checks the hashes), ``auto`` for a run stopped before its
    first save (the trainer starts it afresh in place), None when there is no run there. Refused when
    every checkpoint is damaged: starting afresh would hide the loss."""
    found = list_checkpoints(run_dir / "checkpoints")
    damage = {c.name: checkpoint_problems(c, hashes=False) for c in found}
    intact = [c for c in found if not damage[c.name]]
    if intact:
        return str(intact[-1])
    if found:
        raise Refused(
            409,
            f"every checkpoint in {run_dir / 'checkpoints'} is damaged; resume one by hand or submit the run again",
            [f"{name}: {'; '.join(problems)}" for name, problems in damage.items()],
        )
    return "auto" if RunDirectory(run_dir).holds_run() else None


def _inside(ws: Workspace, raw: str, field: str) -> Path:
    """``raw`` resolved inside the workspace, or a 422 naming ``field``."""
    try:
        return ws.resolve(raw, field)
    except PathRefused as exc:
        raise Refused(422, str(exc), [str(exc)]) from None


def _no_active_job_in(store: JobStore, run_dir: str) -> None:
    busy = [j.id for j in store.in_status("pending", "running") if j.run_dir == run_dir]
    if busy:
        raise Refused(409, f"job {busy[0]} is already queued or running in {run_dir}")


def _queue(
    store,
    ws: Workspace,
    job_id: str,
    cfg,
    source,
    run_dir: Path,
    resume: str | None,
    resumed_job: str | None,
    submitted_by: str | None,
) -> Job:
    _inside(ws, str(run_dir), "run directory")  # whatever route led here, the job writes only in the workspace
    job_dir = ws.jobs_dir() / job_id
    job_dir.mkdir(parents=True)
    text = config_to_yaml(cfg)
    (job_dir / "config.yaml").write_text(text)
    for stream in ("stdout.log", "stderr.log"):
        (job_dir / stream).touch()
    return store.create(
        job_id,
        NewJob(
            kind=cfg.kind,
            config_yaml=text,
            config_source=source,
            job_dir=str(job_dir),
            run_dir=str(run_dir),
            resume_from=resume,
            resumed_job=resumed_job,
            submitted_by=submitted_by,
        ),
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name the file system cannot even look up
        return False
