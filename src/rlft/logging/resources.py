"""The resource monitor: memory and CPU (and GPU) of a training process, sampled in the background.

* every ``interval`` seconds a daemon thread appends a sample to ``resources.jsonl`` (the
  process's RSS, the system's available memory against the limit the process lives under, CPU
  use; on CUDA each device's allocated / reserved / peak memory and, through NVML when
  installed, its utilisation);
* :meth:`ResourceMonitor.step_metrics` gives the numbers ``metrics.jsonl`` carries per step;
* when headroom falls under ``warn_below`` of the limit it warns once (again after it recovered),
  naming the first knob the memory plan would turn;
* the thread can never stop training: a sample that raises is skipped, and after a few failures
  in a row the thread warns and ends.

:func:`diagnose_kill` tells a parent process (the sweep, the job service) whether a child killed
by SIGKILL most likely met the kernel's OOM killer, from the samples the child left. Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import psutil

SECONDS = float(os.environ.get("RLFT_RESOURCE_SECONDS", "5"))
MB = 2**20
MAX_FAILURES = 3
OOM_HEADROOM = 0.05  # a SIGKILL with less free than this share of the limit in the last sample: the OOM killer


class ResourceMonitor:
    """Samples resources from a daemon thread while a run trains (``with ResourceMonitor(...):``)."""

    def __init__(
        self,
        path: Path,
        *,
        interval: float | None = None,
        warn_below: float = 0.1,
        first_knob: str | None = None,
        cuda: bool = False,
        memory_limit: int | None = None,
        log: logging.Logger | None = None,
    ):
        self.path, self.warn_below = Path(path), warn_below
        self.interval = interval if interval is not None else float(os.environ.get("RLFT_RESOURCE_SECONDS", SECONDS))
        self.first_knob, self.cuda = first_knob, cuda
        self.log = log or logging.getLogger("rlft")
        self.step = 0
        self.peak_rss = 0
        self.last: dict = {}
        self.failures = 0
        self._process = psutil.Process()
        # the caller's limit (the trainer passes the cgroup's, which the OOM killer acts on); else the RAM
        self._limit = memory_limit if memory_limit is not None else psutil.virtual_memory().total
        self._warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ResourceMonitor:
        self._process.cpu_percent(None)  # the first call only starts the interval
        self._thread = threading.Thread(target=self._run, name="rlft-resources", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.interval, 1.0) + 5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            try:
                self._record(self.sample())
                self.failures = 0
            except Exception as exc:  # noqa: BLE001  (whatever a probe raises, training goes on)
                self.failures += 1
                if self.failures >= MAX_FAILURES:
                    self.log.warning(
                        f"resource monitor stopped after {self.failures} failed samples "
                        f"({type(exc).__name__}: {exc}); training goes on without it"
                    )
                    return
            if self._stop.wait(self.interval):
                return

    def sample(self) -> dict:
        """One sample: time, step, this process's memory and CPU, the system's, and each GPU's."""
        mem = self._process.memory_info()
        system = psutil.virtual_memory()
        self.peak_rss = max(self.peak_rss, mem.rss)
        # under a cgroup limit lower than RAM, what this process may still take is the limit less its RSS
        available = min(system.available, max(self._limit - mem.rss, 0))
        out = {
            "time": round(time.time(), 3),
            "step": self.step,
            "rss_mb": round(mem.rss / MB, 1),
            "rss_peak_mb": round(self.peak_rss / MB, 1),
            "limit_mb": round(self._limit / MB),
            "available_mb": round(available / MB, 1),
            "system_used_percent": system.percent,
            "cpu_percent": self._process.cpu_percent(None),
            "threads": self._process.num_threads(),
        }
        if self.cuda:
            out["gpus"] = gpu_samples()
        return out

    def _record(self, sample: dict) -> None:
        self.last = sample
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(sample) + "\n")
        self._check_headroom(sample)

    def _check_headroom(self, sample: dict) -> None:
        share = sample["available_mb"] / max(sample["limit_mb"], 1)
        if share < self.warn_below and not self._warned:
            knob = f"; the first thing to turn down: --set {self.first_knob}" if self.first_knob else ""
            self.log.warning(
                f"memory is running out: {sample['available_mb']:.0f} MB of {sample['limit_mb']} MB "
                f"left (this process: {sample['rss_mb']:.0f} MB){knob}"
            )
            self._warned = True
        elif share > 2 * self.warn_below:
            self._warned = False

    def peak_mb(self) -> float:
        """The highest memory this run reached: the process's peak RSS, or on CUDA the largest peak
        any device's allocator saw."""
        import resource

        peak = max(self.peak_rss / MB, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        if self.cuda:
            try:
                peak = max([g["peak_mb"] for g in gpu_samples()] or [peak])
            except Exception:  # noqa: BLE001  (a broken CUDA context after an OOM still gets a report)
                pass
        return round(peak, 1)

    def step_metrics(self) -> dict[str, float]:
        """The latest sample as ``resources/...`` metrics (nothing before the first sample)."""
        s = self.last
        if not s:
            return {}
        out = {
            "resources/rss_mb": s["rss_mb"],
            "resources/rss_peak_mb": s["rss_peak_mb"],
            "resources/available_mb": s["available_mb"],
            "resources/cpu_percent": s["cpu_percent"],
        }
        for gpu in s.get("gpus", []):
            for key in ("allocated_mb", "reserved_mb", "peak_mb", "utilization_percent"):
                if gpu.get(key) is not None:
                    out[f"resources/gpu{gpu['index']}_{key}"] = gpu[key]
        return out


def gpu_samples() -> list[dict]:
    """Allocated, reserved and peak memory of each CUDA device (PyTorch's allocator), with NVML's
    utilisation when ``pynvml`` (nvidia-ml-py) is installed."""
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        out.append(
            {
                "index": i,
                "allocated_mb": round(torch.cuda.memory_allocated(i) / MB, 1),
                "reserved_mb": round(torch.cuda.memory_reserved(i) / MB, 1),
                "peak_mb": round(torch.cuda.max_memory_allocated(i) / MB, 1),
                "utilization_percent": _nvml_utilization(i),
            }
        )
    return out


def _nvml_utilization(index: int) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(index)).gpu)
    except Exception:  # noqa: BLE001  (no NVML, no driver, no permission: no utilisation)
        return None


def last_samples(run_dir: str | Path, n: int = 5) -> list[dict]:
    """The last ``n`` whole samples of a run's resources.jsonl (a torn last line is skipped)."""
    path = Path(run_dir) / "resources.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-(n + 1) :]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out[-n:]


def diagnose_kill(run_dir: str | Path) -> dict | None:
    """For a run whose process died of SIGKILL: the run.json fields of an out-of-memory death
    (``error_type: oom`` and an ``oom`` record with the peak seen and the plan's advice) when its
    last samples show memory nearly exhausted, else None (killed by someone)."""
    samples = last_samples(run_dir)
    if not samples:
        return None
    last = samples[-1]
    peak = max(s.get("rss_peak_mb", 0) for s in samples)
    tight = min(s["available_mb"] / max(s["limit_mb"], 1) for s in samples if "available_mb" in s)
    if tight > OOM_HEADROOM:
        return None
    info = _read_json(Path(run_dir) / "run.json")
    advice = (info.get("memory") or {}).get("if_out_of_memory", [])
    return {
        "error_type": "oom",
        "error": f"killed by the kernel's OOM killer (signal 9) at step {last.get('step')}: the process "
        f"reached {peak:.0f} MB of {last.get('limit_mb')} MB" + (f"; try --set {advice[0]}" if advice else ""),
        "oom": {
            "kind": "cpu",
            "peak_mb": peak,
            "limit_mb": last.get("limit_mb"),
            "step": last.get("step"),
            "advice": advice,
        },
    }


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
