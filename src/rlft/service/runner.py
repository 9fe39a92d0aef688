"""The runner: each job is its own ``rlft`` process, at most ``slots`` at a time, the rest queued FIFO.

A job process starts in its own session (so a restart of the service leaves it running), with
stdout and stderr in separate files of the job's folder and its run directory named by the
service (``--run-dir``). Cancel sends SIGTERM (training finishes its step, saves a checkpoint and
records ``cancelled``), then SIGKILL to the process group after ``grace_seconds``.

Where a process runs is the runner's ``placement`` (:mod:`rlft.service.placement`): this machine by
default, or a Ray cluster (``--backend ray``); this one loop claims, watches, cancels and records the
jobs of every placement the same way.

On start, :meth:`Runner.reconcile` settles every job the store says is running before new work is
accepted: a live process (same pid *and* start time) is re-attached; a process that ended while the
service was down is finished from what its run.json recorded; one that left no record is
``failed``/``service_lost``; a job that was claimed but never started goes back to the queue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlft.config.schema import JOB_KINDS
from rlft.service.placement import JobHandle, LaunchRefused, LocalHandle, LocalPlacement, Placement, alive
from rlft.service.stall import stalled
from rlft.service.store import Job, JobStore

SUMMARY_LINES = 20
LOST = "the job's process ended while the service was not watching it, without recording an outcome"

__all__ = ["Runner", "alive", "read_run_info", "record_oom_kill", "recorded_exit_code", "tail_lines"]


@dataclass
class _Tracked:
    job_id: str
    pid: int | None  # None while the placement has not started the process yet (a Ray job waiting for a node)
    popen: object | None = None  # subprocess.Popen of a local process this runner started
    process: object | None = None  # psutil.Process of a local process re-attached after a restart
    handle: JobHandle | None = None  # the placement's handle (built from popen/process when not given)
    term_sent: float | None = None
    killed: bool = False
    stall_noted: bool = False  # the service log said once that it stalled (again after it recovers)

    def __post_init__(self):
        if self.handle is None:
            self.handle = LocalHandle(self.pid, popen=self.popen, process=self.process)


def tail_lines(path: str | Path, n: int) -> str:
    """The last ``n`` lines of a text file ('' if there is none), read from the end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n:])


def record_oom_kill(run_dir: str) -> str | None:
    """If a run killed by SIGKILL had nearly exhausted its memory (its resources.jsonl says so), write
    the out-of-memory record into its run.json and return its one-line reason; else None."""
    from rlft.logging.resources import diagnose_kill
    from rlft.logging.run_dir import RunDirectory

    verdict = diagnose_kill(run_dir)
    if verdict is None:
        return None
    RunDirectory(Path(run_dir)).write_run_info(status="failed", ended=time.time(), **verdict)
    return verdict["error"]


def recorded_exit_code(info: dict) -> int | None:
    """The exit code an rlft process ends with, as its run.json's final record implies it (None while the
    record is not final): 0 completed; 128 + the signal for a cancelled run (SIGTERM: 143); 2 for a config
    or data error (rlft.errors' exit codes), 1 for any other failure. An explicit ``exit_code`` wins."""
    explicit = info.get("exit_code")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return explicit
    status = info.get("status")
    if status == "completed":
        return 0
    if status == "cancelled":
        try:
            return 128 + signal.Signals[info.get("signal") or "SIGTERM"].value
        except KeyError:
            return 128 + signal.SIGTERM
    if status == "failed":
        return 2 if info.get("error_type") in ("config_invalid", "data") else 1
    return None


def read_run_info(run_dir: str) -> dict:
    try:
        return json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Runner:
    store: JobStore
    workspace_root: Path
    slots: int = 1
    grace_seconds: float = 30.0
    poll_seconds: float = 0.5
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    sweep: str | None = None  # run only this sweep's jobs (rlft sweep); None: only the service's own
    echo: bool = True  # print each event to stderr (rlft sweep prints its own progress lines)
    placement: Placement = field(default_factory=LocalPlacement)  # where processes run: this machine, Ray

    def __post_init__(self):
        self._tracked: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events: list[str] = []  # what reconcile and the loop did, for the service log

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.reconcile()
        self._thread = threading.Thread(target=self._loop, name="rlft-runner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the job processes keep running; the next service start re-attaches them)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.tick()
            except Exception as exc:  # a bad row must not stop the runner; it is logged and retried
                self._note(f"runner error: {type(exc).__name__}: {exc}")

    def _note(self, line: str) -> None:
        self.events.append(line)
        if self.echo:
            print(f"rlft serve: {line}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self) -> None:
        for job in [j for j in self.store.in_status("running") if j.sweep == self.sweep]:
            handle = self.placement.reattach(job)
            if handle is not None:
                self._tracked[job.id] = _Tracked(job.id, job.pid, handle=handle)
                self._note(f"job {job.id}: re-attached to its running process ({handle.where})")
            elif job.pid is None and not (Path(job.run_dir) / "run.json").exists():
                # claimed, but the service stopped before the process started: nothing ran, queue it again
                self.store._cas(job.id, ("running",), status="pending", worker=None, started_at=None)
                self._note(f"job {job.id}: claimed but never started; queued again")
            else:
                self._finish(job, exit_code=None, lost=LOST)

    # ------------------------------------------------------------------ one pass

    def tick(self) -> None:
        self.watch()
        self.launch()

    def watch(self) -> None:
        """Record the jobs whose processes ended; signal the ones asked to cancel. (rlft sweep calls this
        and :meth:`launch` apart, to decide on an ended job before anything new starts.)"""
        with self._lock:
            for tracked in list(self._tracked.values()):
                self._watch(tracked)

    def launch(self) -> None:
        """Start the oldest queued jobs in the free slots."""
        with self._lock:
            while len(self._tracked) < self.slots:
                job = self.store.claim_next(self.worker, self.sweep)
                if job is None:
                    break
                self._launch(job)

    def _watch(self, tracked: _Tracked) -> None:
        job = self.store.get(tracked.job_id)
        try:
            ended, code, lost = tracked.handle.poll()
        except LaunchRefused as exc:  # a remote node could not start it
            del self._tracked[tracked.job_id]
            tracked.handle.release()
            self._refuse(job, exc)
            return
        if tracked.pid is None:
            self._record_process(tracked)
        if ended:
            del self._tracked[tracked.job_id]
            tracked.handle.release()
            self._finish(job, exit_code=code, lost=lost)
            return
        if job.cancel_requested:
            self._cancel(job, tracked)
        self._note_stall(job, tracked)

    def _note_stall(self, job: Job, tracked: _Tracked) -> None:
        """Say once in the service log that a job stopped making progress (and once that it recovered);
        the job keeps running: a hung step is for the user to judge (:mod:`rlft.service.stall`)."""
        verdict = stalled(read_run_info(job.run_dir))
        if verdict and not tracked.stall_noted:
            self._note(f"job {job.id}: {verdict}")
        elif tracked.stall_noted and not verdict:
            self._note(f"job {job.id}: progressing again")
        tracked.stall_noted = bool(verdict)

    def _cancel(self, job: Job, tracked: _Tracked) -> None:
        """SIGTERM once (the run saves a checkpoint and records ``cancelled``), SIGKILL to the group after the grace."""
        now = time.time()
        target = tracked.pid if tracked.pid is not None else "its process (once started)"
        if tracked.term_sent is None:
            tracked.handle.signal(signal.SIGTERM, group=False)
            tracked.term_sent = now
            self._note(f"job {job.id}: cancel requested; sent SIGTERM to {target}")
        elif not tracked.killed and now - tracked.term_sent > self.grace_seconds:
            tracked.handle.signal(signal.SIGKILL, group=True)
            tracked.killed = True
            self._note(f"job {job.id}: still running {self.grace_seconds:.0f} s after SIGTERM; sent SIGKILL")

    def _launch(self, job: Job) -> None:
        job_dir = Path(job.job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        command = JOB_KINDS[job.kind].command.split()[-1]  # "rlft train" -> train
        args = [command, "--config", str(job_dir / "config.yaml"), "--run-dir", job.run_dir]
        if job.resume_from:
            args += ["--resume", job.resume_from]
        env = {"PYTHONUNBUFFERED": "1", "RLFT_JOB_ID": job.id}
        try:
            handle = self.placement.launch(job, args, self.workspace_root, env)
        except LaunchRefused as exc:
            self._refuse(job, exc)
            return
        tracked = _Tracked(job.id, None, handle=handle)
        self._tracked[job.id] = tracked
        self._record_process(tracked, announce=False)
        self._note(f"job {job.id}: started {command} {handle.where}")

    def _record_process(self, tracked: _Tracked, announce: bool = True) -> None:
        """Store the pid (and start time) once the placement has started the process."""
        found = tracked.handle.process()
        if found is None:
            return
        tracked.pid, started, where = found
        self.store.set_process(tracked.job_id, tracked.pid, started)
        if announce:
            self._note(f"job {tracked.job_id}: running {where}")

    def _refuse(self, job: Job, exc: LaunchRefused) -> None:
        if self.store.finish(job.id, "failed", error_type=exc.error_type, summary=exc.summary):
            self._note(f"job {job.id}: failed ({exc.error_type}), not started: {exc.summary}")

    # ------------------------------------------------------------------ the end of a job

    def _finish(self, job: Job, exit_code: int | None, lost: str | None) -> None:
        """Record how ``job`` ended, from its exit code and what its run.json says; ``lost``: why nobody saw
        the process end (it ended while the service was down, its Ray actor died), None if it was watched."""
        info = read_run_info(job.run_dir)
        recorded = info.get("status")
        summary = tail_lines(job.stderr_log, SUMMARY_LINES) or None
        code = exit_code if exit_code is None or exit_code >= 0 else 128 - exit_code  # -9 -> 137, as a shell says
        inferred = None
        if code is None and (code := recorded_exit_code(info)) is not None:
            inferred = (
                f"exit code {code} read from run.json's final status ({recorded}): the process was not this "
                f"service's child (re-attached after a restart, or ended while it was down), so its exit "
                f"code could not be waited on"
            )
        if recorded == "completed" and code in (None, 0):
            status, error, summary = "success", None, None  # stderr's warnings are no summary of a success
        elif recorded == "cancelled" or job.cancel_requested:
            status, error = "cancelled", None
        else:
            status = "failed"
            if info.get("error_type") and recorded == "failed":
                error = info["error_type"]
            elif code == 2:
                error = "config_invalid"
            elif lost:
                error = "service_lost"
                summary = (summary + "\n" if summary else "") + lost
            elif code == 128 + signal.SIGKILL and (oom := record_oom_kill(job.run_dir)):
                error = "oom"
                summary = (summary + "\n" if summary else "") + oom
            elif code is not None and code > 128:
                error = "killed"
            else:
                error = "unknown"
        if inferred:
            summary = (summary + "\n" if summary else "") + inferred
        if self.store.finish(job.id, status, exit_code=code, error_type=error, summary=summary):
            self._note(
                f"job {job.id}: {status}"
                + (f" ({error})" if error else "")
                + (f", exit code {code}" if code is not None else "")
            )
