"""Where the runner's job processes run: this machine (``local``, the default) or a Ray cluster (``ray``).

    placement = LocalPlacement()                 # rlft.service.backends.make_placement picks one by name
    handle = placement.launch(job, ["train", "--config", ..., "--run-dir", ...], cwd, env)

The :class:`~rlft.service.runner.Runner` is the one loop that claims, watches, cancels and records
jobs; a placement only starts a job's ``rlft`` process somewhere and hands back a :class:`JobHandle`
the loop polls and signals. Every placement runs the same command line with the same run directory,
so the run's files (run.json, metrics.jsonl, logs) are where the store and the sweep registry already
read them, and an ended job is recorded by the same rules wherever it ran.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil

if TYPE_CHECKING:
    from rlft.service.store import Job


class LaunchRefused(Exception):
    """A placement will not start this job (e.g. it asks for more than the cluster has); the runner records
    it as failed with ``error_type`` and ``summary`` instead of waiting for a place that never comes."""

    def __init__(self, summary: str, error_type: str = "unknown"):
        super().__init__(summary)
        self.summary, self.error_type = summary, error_type


class JobHandle(Protocol):
    """One launched (or re-attached) job process, as the runner sees it wherever it runs."""

    where: str  # for the runner's log line: "as process 123", "on Ray (2 CPUs, 0 GPUs)"

    def process(self) -> tuple[int, float, str] | None:
        """(pid, start time, where) once the process runs; None while it still waits for a place."""

    def poll(self) -> tuple[bool, int | None, str | None]:
        """(ended, exit code as subprocess reports it or None if unknown, why it was lost or None)."""

    def signal(self, sig: int, group: bool) -> None:
        """Send ``sig`` to the process (``group``: to its whole process group)."""

    def release(self) -> None:
        """Free what the placement held for the ended job."""


class Placement(Protocol):
    """Starts job processes somewhere (:class:`LocalPlacement`, :class:`~rlft.service.ray_placement.RayPlacement`)."""

    name: str

    def launch(self, job: Job, args: list[str], cwd: Path, env: dict[str, str]) -> JobHandle:
        """Start ``rlft <args>`` for ``job`` in ``cwd`` with ``env`` added; :class:`LaunchRefused` if it will not."""

    def reattach(self, job: Job) -> JobHandle | None:
        """The handle of a job an earlier runner launched and that still runs (or awaits collection), else None."""


def interpreter_argv(args: list[str]) -> list[str]:
    """The command line of an ``rlft`` process with this interpreter (``args``: ``train --config ...``)."""
    return [sys.executable, "-m", "rlft.cli.main", *args]


def send_signal(pid: int, sig: int, group: bool) -> None:
    """Signal ``pid`` (or its process group, which a job process leads), ignoring one already gone."""
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def alive(pid: int | None, started: float | None, job_id: str | None = None) -> psutil.Process | None:
    """The process ``pid`` if it still runs and is the job's (a reused pid is not it).

    The job's own environment names it (``RLFT_JOB_ID``, set at launch), which is proof against a wall clock
    that stepped since the launch (a VM resumed, NTP): ``create_time`` is boot time plus ticks, and boot time
    is derived from the wall clock.  Only where the environment cannot be read is the start time compared:
    that includes a process that is exiting (it has released its memory, so its environment reads empty) —
    it still runs, and taking it for gone would record the job's end before its process has ended."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if job_id is not None:
            try:
                named = proc.environ().get("RLFT_JOB_ID")
            except psutil.AccessDenied:
                named = None
            if named is not None:
                return proc if named == job_id else None
        if started is not None and abs(proc.create_time() - started) > 2.0:
            return None
        return proc
    except psutil.Error:
        return None


def start_job_process(argv: list[str], cwd: Path, env: dict[str, str], stdout_log: Path, stderr_log: Path):
    """A job's process, in a session of its own, its output appended to the two logs: a
    :class:`subprocess.Popen` (what a :class:`LocalHandle` uses of it: ``pid`` and ``poll()``)."""
    import subprocess

    with open(stdout_log, "ab") as out, open(stderr_log, "ab") as err:
        return subprocess.Popen(
            argv, cwd=cwd, stdout=out, stderr=err, env=env, stdin=subprocess.DEVNULL, start_new_session=True
        )


class LocalHandle:
    """A process on this machine: one this runner started (``popen``) or one re-attached by pid (``process``)."""

    def __init__(self, pid: int, popen=None, process: psutil.Process | None = None, started: float | None = None):
        self.pid, self.popen, self.proc, self.started = pid, popen, process, started
        self.where = f"as process {pid}"

    def process(self) -> tuple[int, float, str] | None:
        return self.pid, self.started if self.started is not None else time.time(), self.where

    def poll(self) -> tuple[bool, int | None, str | None]:
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code, None
        try:  # a re-attached process is not our child: its exit code is unknowable, run.json tells the outcome
            ended = self.proc.status() == psutil.STATUS_ZOMBIE or not self.proc.is_running()
        except psutil.NoSuchProcess:
            ended = True
        return ended, None, None

    def signal(self, sig: int, group: bool) -> None:
        send_signal(self.pid, sig, group)

    def release(self) -> None:
        pass


class LocalPlacement:
    """Each job is a child process of this one, in its own session (so a restart of the service leaves it
    running and :meth:`reattach` finds it again by pid and start time)."""

    name = "local"

    def launch(self, job: Job, args: list[str], cwd: Path, env: dict[str, str]) -> LocalHandle:
        try:
            popen = self.start_process(
                interpreter_argv(args), cwd, {**os.environ, **env}, Path(job.stdout_log), Path(job.stderr_log)
            )
        except OSError as exc:
            raise LaunchRefused(f"could not start: {exc}") from None
        try:
            started = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            started = time.time()
        return LocalHandle(popen.pid, popen=popen, started=started)

    # How a job's process is started; the test suite starts the jobs of in-process sweeps and of its
    # services from an interpreter that has imported torch already, here.
    start_process = staticmethod(start_job_process)

    def reattach(self, job: Job) -> LocalHandle | None:
        proc = alive(job.pid, job.pid_started, job.id)
        return None if proc is None else LocalHandle(job.pid, process=proc, started=job.pid_started)
