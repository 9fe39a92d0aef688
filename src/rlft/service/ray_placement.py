"""The Ray placement: each job's ``rlft`` process runs on a node of a Ray cluster that Ray picks.

    placement = RayPlacement.connect("auto")      # ray.init(address=...); None starts a local instance

A job is one detached Ray actor (:class:`JobProcess`, named ``rlft-job-<job id>`` in the ``rlft``
namespace) that reserves the CPUs and GPUs its config declares and, on its node, runs exactly the
command a local job runs (``python -m rlft.cli.main train --config <job_dir>/config.yaml --run-dir
<run_dir>``) as a child process in its own session. Nothing is streamed back: the run directory,
the job's stdout/stderr logs and run.json are written on the filesystem the nodes share, where the
job store and the sweep registry read them as for a local job. The actor returns the exit code, so
an ended job is recorded by the same rules; a cancel is the same SIGTERM (then SIGKILL to the process
group), sent by the actor on the job's node. An actor that dies (its node lost, Ray stopped) is a
lost job. Detached actors outlive the process that launched them, so a restarted ``rlft serve`` or
``rlft sweep --resume`` re-attaches to them by name, like a local runner re-attaches by pid.

Resources reserved per job: CPUs = ``train.num_threads`` if set, else 1 (the process is also given
``OMP_NUM_THREADS`` = that number, which rlft uses when ``train.num_threads`` is unset); GPUs = 1
when ``model.device`` is ``cuda``/``cuda:0``, or ``auto`` on a cluster that has GPUs, else 0.

Ray is an optional extra (``pip install 'rlft[ray]'``): this module imports it only when a Ray
placement is made, and :class:`JobProcess` is a plain class, made an actor with ``ray.remote`` there.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from rlft.errors import ConfigError, UsageError
from rlft.service.placement import LaunchRefused, LocalPlacement, interpreter_argv, send_signal

if TYPE_CHECKING:
    from rlft.service.store import Job

NAMESPACE = "rlft"
CONCURRENCY = 4  # the actor's threads: wait() blocks one while info() and signal() are answered


def import_ray():
    """The ``ray`` module, or a usage error (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError("--backend ray needs Ray, which is an optional extra: pip install 'rlft[ray]'") from None
    return ray


def actor_name(job_id: str) -> str:
    return f"rlft-job-{job_id}"


def config_demands(job: Job) -> tuple[int, str]:
    """(CPUs, model.device) of the job's resolved config: ``train.num_threads`` or 1, and the device."""
    from rlft.config.loader import load_config
    from rlft.config.yamlio import load_yaml_text

    try:
        cfg = load_config(
            data=load_yaml_text(job.config_yaml, f"job {job.id}'s config"), check_files=False, kind=job.kind
        )
    except ConfigError as exc:
        raise LaunchRefused(str(exc), "config_invalid") from None
    return cfg.train.num_threads or 1, cfg.model.device


def gpus_for(device: str, cluster_gpus: float) -> int:
    """GPUs to reserve for ``model.device``. Ray gives the job the GPU it picks, which the process sees as
    cuda:0 (Ray sets CUDA_VISIBLE_DEVICES), so a config naming another GPU index cannot be honoured."""
    if device == "cpu":
        return 0
    if device == "auto":
        return 1 if cluster_gpus > 0 else 0
    if device in ("cuda", "cuda:0"):
        return 1
    raise LaunchRefused(
        f"model.device {device}: on Ray a job gets one GPU that Ray chooses and sees it as cuda:0; "
        f"set model.device to cuda or auto",
        "config_invalid",
    )


class JobProcess:
    """One job's process on the node Ray placed this actor on; the actor holds the job's CPUs and GPUs while
    it lives. The process starts in ``__init__``, so every later call (a cancel's signal too) reaches it."""

    def __init__(self, args: list[str], cwd: str, env: dict[str, str], stdout_log: str, stderr_log: str):
        self.node = socket.gethostname()
        self.popen: subprocess.Popen | None = None
        self.started: float | None = None
        self.error: str | None = None
        try:
            with open(stdout_log, "ab") as out, open(stderr_log, "ab") as err:
                self.popen = subprocess.Popen(
                    interpreter_argv(args),
                    cwd=cwd,
                    stdout=out,
                    stderr=err,
                    env={**os.environ, **env},
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except OSError as exc:
            self.error = (
                f"could not start on Ray node {self.node}: {exc} (the Ray backend needs the workspace "
                f"and the job's folders on a filesystem every node shares, at the same path)"
            )
            return
        try:
            self.started = psutil.Process(self.popen.pid).create_time()
        except psutil.Error:
            self.started = None

    def info(self) -> tuple[str, int | None, float | None]:
        """(node, pid, start time); pid None when the process could not start."""
        return self.node, self.popen.pid if self.popen else None, self.started

    def wait(self) -> int | str:
        """The exit code once the process ends (negative: the signal), or why it never started."""
        return self.popen.wait() if self.popen is not None else self.error

    def signal(self, sig: int, group: bool) -> None:
        if self.popen is not None and self.popen.poll() is None:
            send_signal(self.popen.pid, sig, group)


class RayHandle:
    """A job's actor as the runner sees it: polled without blocking, signalled through the actor."""

    def __init__(self, ray, actor, where: str):
        self.ray, self.actor, self.where = ray, actor, where
        self._info_ref = actor.info.remote()
        self._exit_ref = actor.wait.remote()
        self._info: tuple[int, float, str] | None = None

    def _ready(self, ref) -> bool:
        return bool(self.ray.wait([ref], timeout=0)[0])

    def process(self) -> tuple[int, float, str] | None:
        if self._info is None and self._ready(self._info_ref):
            try:
                node, pid, started = self.ray.get(self._info_ref)
            except self.ray.exceptions.RayError:
                return None  # the actor died before it answered: poll() reports it
            if pid is not None:
                self._info = (pid, started, f"as process {pid} on {node}")
        return self._info

    def poll(self) -> tuple[bool, int | None, str | None]:
        if not self._ready(self._exit_ref):
            return False, None, None
        try:
            result = self.ray.get(self._exit_ref)
        except self.ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return (
                True,
                None,
                (
                    f"its Ray actor died ({first}): its node was lost, Ray was stopped, or the actor "
                    f"was killed, before the process recorded an outcome"
                ),
            )
        if isinstance(result, str):
            raise LaunchRefused(result)
        return True, result, None

    def signal(self, sig: int, group: bool) -> None:
        if group and self.process() is None:  # the SIGKILL of a job still waiting for a place: drop its actor
            self.release()
            return
        self.actor.signal.remote(sig, group)

    def release(self) -> None:
        try:
            self.ray.kill(self.actor, no_restart=True)
        except (ValueError, self.ray.exceptions.RayError):
            pass  # already gone


class RayPlacement:
    """Jobs as detached actors on the Ray cluster this process is connected to."""

    name = "ray"

    def __init__(self, ray):
        self.ray = ray
        self._actor = ray.remote(JobProcess)

    @classmethod
    def connect(cls, address: str | None) -> RayPlacement:
        """Connect (once per process) to the cluster at ``address``: None means ``auto`` when RAY_ADDRESS is
        set, else a new local instance with all this machine's CPUs and GPUs."""
        ray = import_ray()
        if not ray.is_initialized():
            target = address if address is not None else ("auto" if os.environ.get("RAY_ADDRESS") else None)
            extra = {"include_dashboard": False} if target is None else {}
            try:
                ray.init(address=target, log_to_driver=False, **extra)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = f"the Ray cluster at {target}" if target else "a local Ray instance"
                raise UsageError(f"--backend ray: could not connect to {where}: {exc}") from None
        return cls(ray)

    def resources(self, job: Job) -> tuple[int, int]:
        """(CPUs, GPUs) the job reserves; refused when the cluster has fewer in all (it would wait forever)."""
        cpus, device = config_demands(job)
        total = self.ray.cluster_resources()
        gpus = gpus_for(device, total.get("GPU", 0))
        if cpus > total.get("CPU", 0) or gpus > total.get("GPU", 0):
            raise LaunchRefused(
                f"the job needs {cpus} CPUs and {gpus} GPUs (train.num_threads, model.device); the "
                f"Ray cluster has {total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs in all",
                "config_invalid",
            )
        return cpus, gpus

    def launch(self, job: Job, args: list[str], cwd: Path, env: dict[str, str]) -> RayHandle:
        cpus, gpus = self.resources(job)
        try:
            actor = self._actor.options(
                name=actor_name(job.id),
                namespace=NAMESPACE,
                lifetime="detached",
                num_cpus=cpus,
                num_gpus=gpus,
                max_concurrency=CONCURRENCY,
            ).remote(args, str(cwd), {**env, "OMP_NUM_THREADS": str(cpus)}, job.stdout_log, job.stderr_log)
        except ValueError as exc:  # an actor of this name already exists
            raise LaunchRefused(f"could not place the job on Ray: {exc}") from None
        return RayHandle(self.ray, actor, where=f"on Ray ({cpus} CPUs, {gpus} GPUs)")

    def reattach(self, job: Job):
        """The job's actor if it still exists (launched by an earlier service or sweep process); else its
        process by pid on this machine (a local Ray instance went down with its driver, the process did not)."""
        try:
            actor = self.ray.get_actor(actor_name(job.id), namespace=NAMESPACE)
        except ValueError:
            return LocalPlacement().reattach(job)
        return RayHandle(self.ray, actor, where=f"on Ray (actor {actor_name(job.id)})")
