"""Running a sweep: the job service's :class:`~rlft.service.runner.Runner` launches and watches the
processes (``--parallel`` slots, FIFO); this loop decides what each ended attempt means.

    sweep = Sweep(store, sweep_dir, SweepOptions(parallel=2))
    sweep.run(sweep.plan(specs, resume=False))

An attempt that failed with a class in ``retry_on`` (default ``transient``) is tried again, at
most ``retries`` times, after ``backoff * 2**(n-1)`` seconds. A retry continues the run's latest
complete checkpoint (``--resume auto`` in the same run directory); an attempt that left none has
its directory moved aside to ``<run_dir>.attempt-<n>`` and the retry starts afresh (a run
directory that holds a run is never reused for a new one). The other runs go on past a failure,
unless ``fail_fast``: then nothing new starts and the running attempts are cancelled (each saves a
checkpoint, so ``--resume`` continues them).

``backend="ray"`` places the processes on a Ray cluster instead of this machine (the runner's
:mod:`~rlft.service.placement`); nothing else changes: the same loop, registry and run directories.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlft.atomic import free_name
from rlft.checkpoint.layout import has_optimizer_state, list_checkpoints
from rlft.errors import UsageError
from rlft.logging.run_dir import RunDirectory
from rlft.service.backends import make_placement
from rlft.service.runner import Runner, read_run_info
from rlft.service.store import TERMINAL, Job, JobStore
from rlft.sweep.failures import DEFAULT_RETRY_ON, classify, retryable
from rlft.sweep.metrics import run_metrics
from rlft.sweep.plan import RunSpec, run_dir_name
from rlft.sweep.registry import add_attempt, attempts_by_name, record_invalid, sweep_id
from rlft.sweep.summary import gist

RESUMED_CLASSES = ("killed",)  # an interrupted run (the sweep or the machine went down) is continued by --resume


@dataclass
class SweepOptions:
    parallel: int = 1
    retries: int = 2
    retry_on: tuple[str, ...] = DEFAULT_RETRY_ON
    backoff: float = 10.0
    fail_fast: bool = False
    poll_seconds: float = 0.25
    grace_seconds: float = 30.0  # after a cancel's SIGTERM, before SIGKILL
    backend: str = "local"  # where the runs' processes run: this machine, or "ray" (a Ray cluster)
    ray_address: str | None = None  # ray.init's address (None: RAY_ADDRESS if set, else a local Ray instance)


@dataclass
class Track:
    """One run while the sweep drives it: its latest attempt (``job_id``) and what comes next."""

    spec: RunSpec
    run_dir: Path
    index: int = 0
    job_id: str | None = None
    attempt: int = 0  # the attempt number of job_id
    tries: int = 0  # attempts started by this invocation
    retry_at: float | None = None  # a retry waiting out its backoff
    done: bool = False
    announced: bool = False  # its start was reported


@dataclass
class Sweep:
    store: JobStore
    sweep_dir: Path
    options: SweepOptions = field(default_factory=SweepOptions)
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    def __post_init__(self):
        self.sweep = sweep_id(self.sweep_dir)
        placement = make_placement(self.options.backend, self.options.ray_address)
        self.runner = Runner(
            self.store,
            Path.cwd(),
            slots=self.options.parallel,
            grace_seconds=self.options.grace_seconds,
            sweep=self.sweep,
            echo=False,
            placement=placement,
        )
        self.stopping = False  # --fail-fast tripped or Ctrl-C: start nothing new
        self.interrupted = False
        self._total = 0

    # ------------------------------------------------------------------ planning

    def plan(self, specs: list[RunSpec] | None, resume: bool) -> list[Track]:
        """Tracks for ``specs`` (None with ``resume``: the runs the registry holds). Without ``resume`` the
        sweep directory must not hold a sweep yet; with it, each run continues from its latest attempt."""
        if resume:
            self.runner.reconcile()  # after a crash: re-attach live processes, settle the dead ones first
        previous = attempts_by_name(self.store, self.sweep)
        if previous and not resume:
            raise UsageError(
                f"{self.sweep_dir} already holds a sweep ({len(previous)} runs); continue it with "
                f"--resume --out {self.sweep_dir}, or choose another --out"
            )
        if resume and not previous:
            raise UsageError(f"--resume: {self.sweep_dir} holds no sweep to continue (no runs in its registry)")
        if specs is None:
            specs = [_spec_of(rows[-1]) for rows in previous.values()]
        day = time.strftime("%Y%m%d")
        tracks = []
        for i, spec in enumerate(specs):
            rows = previous.get(spec.name)
            run_dir = (
                Path(rows[-1].run_dir)
                if rows
                else (self.sweep_dir / "runs" / run_dir_name(spec, uuid.uuid4().hex[:6], day)).resolve()
            )
            track = Track(spec, run_dir, index=i + 1)
            if rows:
                self._continue_from(track, rows[-1])
            tracks.append(track)
        self._total = len(tracks)
        return tracks

    def _continue_from(self, track: Track, last: Job) -> None:
        """--resume: skip a success, keep a failure no retry can fix, watch or continue the rest."""
        track.job_id, track.attempt = last.id, last.attempt or 1
        cls = last.failure_class
        if last.status == "failed" and cls is None:
            cls = _failure_class(last, read_run_info(last.run_dir))
            self.store.record_outcome(last.id, failure_class=cls)
        if last.status in ("pending", "running"):
            track.tries = 1  # an attempt still queued or running (re-attached by reconcile): watch it
        elif last.status == "success" or (
            last.status == "failed" and cls not in RESUMED_CLASSES and not retryable(cls, self.options.retry_on)
        ):
            track.done = track.announced = True
            why = "succeeded" if last.status == "success" else f"failed ({cls}); a retry cannot fix it"
            self._line(track, f"skipped: {why} in attempt {track.attempt}")

    # ------------------------------------------------------------------ running

    def run(self, tracks: list[Track]) -> None:
        """Record the invalid configs, queue the rest, and drive them all to an end (Ctrl-C: cancel them)."""
        todo = [t for t in tracks if not t.done and not t.tries]
        invalid = [t for t in todo if not t.spec.valid]
        for track in invalid:
            job = record_invalid(self.store, self.sweep_dir, track.spec, track.run_dir, track.attempt + 1, track.job_id)
            track.job_id, track.attempt, track.done = job.id, job.attempt, True
            self._line(track, f"failed (config_invalid), not run: {gist(track.spec.error)}")
        for track in todo:
            if track.spec.valid:
                self._submit(track)  # every planned run gets its row, even one --fail-fast cancels at once
        if invalid:
            self._trip_fail_fast(tracks)
        try:
            self._drive(tracks)
        except KeyboardInterrupt:
            self.interrupted = True
            self.say(
                "interrupted: cancelling the running attempts (each saves a checkpoint; --resume continues "
                "them); Ctrl-C again leaves them running"
            )
            self._cancel_all(tracks)
            try:
                self._drive(tracks)
            except KeyboardInterrupt:
                pass

    def _drive(self, tracks: list[Track]) -> None:
        while not all(t.done for t in tracks):
            self.runner.watch()
            for track in tracks:
                if not track.done:
                    self._step(track, tracks)
            if not self.stopping:  # an ended run is decided on (--fail-fast) before the next one starts
                self.runner.launch()
            time.sleep(self.options.poll_seconds)

    def _step(self, track: Track, tracks: list[Track]) -> None:
        if track.retry_at is not None:
            if time.time() >= track.retry_at:
                track.retry_at = None
                self._submit(track)
            return
        job = self.store.get(track.job_id)
        if job.started_at and not track.announced:
            track.announced = True
            self._line(
                track,
                f"started attempt {job.attempt}"
                + (" (resuming its latest checkpoint)" if job.resume_from else "")
                + f" -> {job.run_dir}",
            )
        if job.status in TERMINAL:
            self._ended(track, job, tracks)

    def _submit(self, track: Track) -> None:
        """Queue the next attempt: continuing the run's checkpoint if it has one, else afresh."""
        resume = None
        if track.job_id is not None:
            if _resumable(track.run_dir):
                resume = "auto"
            elif RunDirectory(track.run_dir).holds_run():
                aside = free_name(track.run_dir.with_name(f"{track.run_dir.name}.attempt-{track.attempt}"))
                track.run_dir.rename(aside)
                self._line(
                    track, f"attempt {track.attempt} left no checkpoint to resume; its directory moved to {aside.name}"
                )
        job = add_attempt(
            self.store,
            self.sweep_dir,
            track.spec,
            track.run_dir,
            attempt=track.attempt + 1,
            retry_of=track.job_id,
            resume=resume,
        )
        track.job_id, track.attempt, track.announced = job.id, job.attempt, False
        track.tries += 1

    def _ended(self, track: Track, job: Job, tracks: list[Track]) -> None:
        info = read_run_info(job.run_dir)
        cls = _failure_class(job, info) if job.status == "failed" else None
        final, best = run_metrics(job.run_dir)
        self.store.record_outcome(
            job.id, failure_class=cls, metrics_final=json.dumps(final), metrics_best=json.dumps(best)
        )
        took = f" in {_seconds(job)}" if job.started_at else ""
        if job.status != "failed":
            self._line(track, f"{job.status}{took}" + _brief(final))
        else:
            self._line(track, f"failed ({cls}){took}: {gist(info.get('error') or job.summary)}")
        if (
            job.status == "failed"
            and retryable(cls, self.options.retry_on)
            and track.tries <= self.options.retries
            and not self.stopping
        ):
            delay = self.options.backoff * 2 ** (track.tries - 1)
            track.retry_at = time.time() + delay
            self._line(
                track,
                f"retrying in {delay:g} s (attempt {track.attempt + 1} of at most "
                f"{track.attempt - track.tries + self.options.retries + 1})",
            )
            return
        track.done = True
        if job.status == "failed":
            self._trip_fail_fast(tracks)

    def _trip_fail_fast(self, tracks: list[Track]) -> None:
        if self.options.fail_fast and not self.stopping:
            self.say("--fail-fast: a run failed; starting nothing new and cancelling the running attempts")
            self._cancel_all(tracks)

    def _cancel_all(self, tracks: list[Track]) -> None:
        self.stopping = True
        for track in tracks:
            if track.done:
                continue
            if track.retry_at is not None or track.job_id is None:
                track.retry_at, track.done = None, True  # its last attempt's failure stands
            else:
                self.store.request_cancel(track.job_id)

    def _line(self, track: Track, text: str) -> None:
        self.say(f"[{track.index}/{self._total}] {track.spec.name}: {text}")


def _failure_class(job: Job, info: dict) -> str:
    """The class of a failed attempt (:func:`~rlft.sweep.failures.classify`): from what its process left, or,
    for an attempt that never had a process or a run.json, from the runner's recorded reason as if run.json
    held it (a Ray job asking for more GPUs than the cluster has is ``config_invalid``; a lost one ``killed``)."""
    if job.pid is None and not info and job.error_type:
        info = {"status": "failed", "error_type": job.error_type}
    return classify(info, job.exit_code, job.run_dir)


def _spec_of(job: Job) -> RunSpec:
    """A run planned by an earlier invocation, from its latest row (its config validated then)."""
    return RunSpec(name=job.name or job.id, source=job.config_source, config_yaml=job.config_yaml, kind=job.kind)


def _resumable(run_dir: Path) -> bool:
    """Whether ``--resume auto`` can continue ``run_dir``: its latest complete checkpoint has the optimizer
    state (``train.save_optimizer: false`` writes export-only checkpoints that a resume refuses)."""
    found = list_checkpoints(run_dir / "checkpoints")
    return bool(found) and has_optimizer_state(found[-1])


def _seconds(job: Job) -> str:
    return f"{(job.finished_at or time.time()) - job.started_at:.1f} s"


def _brief(final: dict) -> str:
    shown = [f"{k} {v:.4g}" for k, v in final.items() if k in ("reward/mean", "loss", "eval/accuracy")]
    return f" ({', '.join(shown)})" if shown else ""
