"""How many compute threads torch runs on a CPU: one per physical core this process may use.

A hyperthread sibling shares its core's vector units, so a second matmul thread per core only adds
synchronisation; and threads beyond the cores the process may run on (``taskset``, a container's
CPU quota) make every op wait for a descheduled thread, which shows as system time. torch's own
default counts neither.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, sys_cpu: Path = SYS_CPU, cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Distinct physical cores among ``cpus`` (default: :func:`usable_cpus`), at most the cgroup's CPU
    quota rounded up; the CPU count where the topology is not readable."""
    cpus = usable_cpus() if cpus is None else cpus
    cores = set()
    for cpu in cpus:
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            cores.add(
                ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            )
        except OSError:
            cores.add(("cpu", str(cpu)))  # unknown topology: count the CPU itself
    count = max(len(cores), 1)
    quota = _cgroup_quota(cpu_max)
    return min(count, quota) if quota else count


def _cgroup_quota(cpu_max: Path) -> int | None:
    """CPUs a cgroup v2 quota allows ("200000 100000" -> 2), None without a quota."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(math.ceil(int(quota) / int(period)), 1)


def configure_threads(requested: int | None) -> tuple[int, str | None]:
    """Set torch's intra-op threads to ``requested``, else to ``OMP_NUM_THREADS`` when the user set it,
    else to one per physical core. Returns (threads, a warning when the setting is the slow choice)."""
    import torch

    cores = physical_cores()
    source = "train.num_threads"
    if requested is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        requested, source = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    threads = cores if requested is None else requested
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    warning = None
    if threads > cores:
        warning = (
            f"{source}={threads} is more than the {cores} physical core(s) this process may use: every op "
            f"then waits on descheduled threads; {cores} is faster (or leave it unset)"
        )
    return threads, warning
