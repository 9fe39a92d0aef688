"""What a training process tells the outside world while it runs: it stops cleanly when asked
(SIGTERM, Ctrl-C), it keeps a heartbeat in run.json so a job service can tell a live run
from one whose process is gone, and under torchrun it joins the run's other processes. Also the
process-level compute settings a run applies once at start (memory, threads, native kernels)."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from rlft.errors import RlftError, error_type
from rlft.logging.run_dir import RunDirectory

HEARTBEAT_SECONDS = float(os.environ.get("RLFT_HEARTBEAT_SECONDS", "5"))


class StopRequest:
    """Turns SIGTERM and a first Ctrl-C into a request to stop after the current step.

    The loop checks :attr:`requested` between steps, saves a checkpoint and records ``cancelled``.
    A second Ctrl-C raises KeyboardInterrupt at once (the last complete checkpoint stays intact).
    Signal handlers can only be set from the main thread; elsewhere (a Trainer run in a worker
    thread) this does nothing and the host program owns its signals."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def signal_name(self) -> str:
        """The signal's name (``SIGTERM``), or "" when none came."""
        return signal.Signals(self.signal).name if self.signal is not None else ""

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by this signal: 128 + its number."""
        return 128 + (self.signal or signal.SIGTERM)

    def agreed(self, dist) -> bool:
        """Whether to stop before the next step. The processes of a data-parallel run (``dist``, a
        :class:`rlft.distributed.context.Dist`) agree on it (one process that got SIGTERM stops them all
        at the same step), so none of them is left waiting for the others at a collective while they
        save the checkpoint."""
        if not dist.enabled:
            return self.requested
        import torch

        agreed = bool(dist.all_reduce(torch.tensor([int(self.requested)]), op="max").item())
        if agreed and not self.requested:
            self.signal = signal.SIGTERM  # another process was asked to stop
        return agreed

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Heartbeat:
    """Writes ``heartbeat`` (unix time) into run.json every :data:`HEARTBEAT_SECONDS` from a daemon
    thread, beside the process's ``pid`` written once at start.

    A fresh heartbeat only says the process lives: a step that hangs (a reward that never returns)
    keeps it beating. So each beat also carries the run's progress, noted by the loop through
    :meth:`progress`: ``progress`` (the time the last step completed, or the current phase began),
    ``progress_step`` and ``step_seconds`` (the median time between completed steps so far). The job
    service compares them with the clock to say a run is stalled (:mod:`rlft.service.stall`). Noting
    progress costs no write: the next beat records it."""

    def __init__(self, run_dir: RunDirectory, seconds: float = HEARTBEAT_SECONDS):
        self.run_dir, self.seconds = run_dir, seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._progress: dict = {"progress": time.time(), "progress_step": None}
        self._last_step_at: float | None = None
        self._durations: deque[float] = deque(maxlen=1000)

    def __enter__(self) -> Heartbeat:
        self.run_dir.write_run_info(pid=os.getpid(), heartbeat=time.time(), **self.progress_fields())
        self._thread = threading.Thread(target=self._beat, name="rlft-heartbeat", daemon=True)
        self._thread.start()
        return self

    def progress(self, step: int | None = None) -> None:
        """Note that the run advanced: ``step`` completed now, or (no step) a phase began now. A phase
        start is written at once (it is rare, and a long model load must not read as a stall for a beat)."""
        now = time.time()
        with self._lock:
            if step is not None and self._last_step_at is not None:
                self._durations.append(now - self._last_step_at)
            self._last_step_at = now
            self._progress = {
                "progress": now,
                "progress_step": step if step is not None else self._progress.get("progress_step"),
            }
        if step is None:
            self._write()

    def _write(self) -> None:
        try:
            self.run_dir.write_run_info(heartbeat=time.time(), **self.progress_fields())
        except (OSError, RlftError):  # a full disk must not kill training; the loop reports it at its next write
            pass

    def progress_fields(self) -> dict:
        """run.json's progress fields as of now."""
        with self._lock:
            fields = dict(self._progress)
            if self._durations:
                fields["step_seconds"] = round(statistics.median(self._durations), 3)
        return fields

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds):
            self._write()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def join_process_group(cfg):
    """This process's :class:`~rlft.distributed.Dist`: under torchrun (WORLD_SIZE > 1) it joins the
    process group; a kind of job that cannot run data-parallel is refused there, not run N times."""
    from rlft.config.schema import JOB_KINDS
    from rlft.distributed import init_distributed, launched_by_torchrun
    from rlft.errors import UsageError

    if launched_by_torchrun() and not JOB_KINDS[cfg.kind].data_parallel:
        raise UsageError(
            f"kind {cfg.kind} runs in one process; under torchrun (WORLD_SIZE="
            f"{os.environ.get('WORLD_SIZE')}) it would train {os.environ.get('WORLD_SIZE')} independent "
            f"copies. Data-parallel training is implemented for: "
            + ", ".join(k for k, v in JOB_KINDS.items() if v.data_parallel)
        )
    d = cfg.distributed
    dist = init_distributed(d.strategy, d.backend, cfg.model.device, d.timeout_minutes)
    if dist.enabled and cfg.model.dtype == "auto":  # every rank computes in the dtype rank 0 measured best
        from rlft.models.precision import adopt_bf16_speedup, bf16_matmul_speedup

        adopt_bf16_speedup(dist.broadcast_object(bf16_matmul_speedup() if dist.rank == 0 else None))
    return dist


def leave_process_group(together: bool) -> None:
    """Leave the process group; ``together`` when every process ended the run the same way (see
    :func:`rlft.distributed.shutdown_distributed`)."""
    from rlft.distributed import shutdown_distributed

    shutdown_distributed(together)


def configure_compute(cfg, log) -> None:
    """The process-level settings a run's config asks for, applied once at setup, each with its log line:
    freed memory kept mapped, the compute thread count (``train.num_threads``) and rlft's native
    kernels (``train.native_kernels``; on a CPU the log says whether they built, and if not, why)."""
    from rlft.models.loading import resolve_device
    from rlft.speed.allocator import keep_freed_memory
    from rlft.speed.kernels import cpu_kernels, set_enabled, unavailable_reason
    from rlft.speed.threads import configure_threads

    keep_freed_memory()  # large tensors are reused warm, not faulted in again every step
    threads, warning = configure_threads(cfg.train.num_threads)
    if warning:
        log.warning(warning)
    log.info(f"cpu threads: {threads}")
    set_enabled(cfg.train.native_kernels)
    if not cfg.train.native_kernels or resolve_device(cfg.model.device).type != "cpu":
        return
    kernels = cpu_kernels()
    if kernels is None:
        log.warning(
            f"train.native_kernels: not available here ({unavailable_reason()}); the decode step, sampling "
            f"and the softmaxes of the LM head and attention run as PyTorch ops (a bf16 decode step 1.4x "
            f"slower)"
        )
    else:
        log.info(f"{kernels.describe()}: decode step, sampling, LM head and attention softmax")


def ended_by(exc: BaseException, step: int, memory, peak_mb: float | None) -> dict:
    """run.json's record of a run ended by ``exc``: a second Ctrl-C is a cancellation, anything else a
    failure with its kind (:func:`rlft.errors.error_type`); out of memory adds the peak the resource
    monitor saw (``peak_mb``) and the memory plan's advice (``memory``: the plan, or None)."""
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "cancelled", "signal": "SIGINT"}
    kind = error_type(exc)
    out: dict[str, Any] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "error_type": kind}
    if kind == "oom":
        advice = memory.if_out_of_memory if memory is not None else []
        out["oom"] = {
            "kind": "cuda" if "cuda" in str(exc).lower() else "cpu",
            "step": step,
            "peak_mb": peak_mb,
            "advice": advice,
        }
        if advice:
            out["error"] += f" | try --set {advice[0]} (rlft estimate --config ... for the whole list)"
    return out


def stop_note(checkpoint: Path | None) -> str:
    """What a stopped run kept, truthfully: its checkpoint, or none because no step had completed."""
    if checkpoint is not None:
        return f"checkpoint kept: {checkpoint}; continue with --resume auto"
    return (
        "no checkpoint was written, as no step had completed; --resume auto starts the run afresh in the same directory"
    )


def on_cuda(device: str) -> bool:
    """Whether a run on ``device`` (the config's model.device) runs on a CUDA GPU."""
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()
