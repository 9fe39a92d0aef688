"""Thread count: one per physical core the process may use; a setting above that is warned about."""

from __future__ import annotations

import pytest
import torch

from rlft.speed.threads import configure_threads, physical_cores


def _topology(root, cpus: dict[int, tuple[int, int]]):
    for cpu, (package, core) in cpus.items():
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return root


def test_hyperthread_siblings_count_as_one_core(tmp_path):
    # 2 packages x 2 cores x 2 threads; the process may run on CPUs 0-5
    sys_cpu = _topology(
        tmp_path / "cpu", {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}
    )
    none = tmp_path / "no-cgroup"
    assert physical_cores(list(range(8)), sys_cpu, none) == 4
    assert physical_cores([0, 4], sys_cpu, none) == 1
    assert physical_cores([0, 1, 2, 3, 4, 5], sys_cpu, none) == 4


def test_a_cgroup_quota_caps_the_count_and_unknown_topology_counts_cpus(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert physical_cores(list(range(8)), tmp_path / "missing", cpu_max) == 2  # 1.5 CPUs -> 2 threads
    cpu_max.write_text("max 100000\n")
    assert physical_cores(list(range(3)), tmp_path / "missing", cpu_max) == 3


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_unset_means_physical_cores_and_too_many_is_warned(monkeypatch, restore_threads):
    monkeypatch.setattr("rlft.speed.threads.physical_cores", lambda: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert configure_threads(None) == (1, None)
    assert torch.get_num_threads() == 1
    threads, warning = configure_threads(3)
    assert threads == 3 and torch.get_num_threads() == 3
    assert "train.num_threads=3 is more than the 1 physical core(s)" in warning
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads, warning = configure_threads(None)
    assert threads == 2 and warning.startswith("OMP_NUM_THREADS=2 ")
