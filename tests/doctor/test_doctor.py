"""rlft doctor: what it reports about this machine, and its failures with a fix."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from rlft.doctor import FAIL, OK, doctor
from rlft.doctor.machine import check_port
from tests.cli.test_cli import run_cli


def _by_name(report):
    return {c.name: c for c in report.checks}


def _cpuinfo(field: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return ""


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo")
def test_reports_this_cpu_its_bf16_and_the_gpus_it_has():
    import torch

    checks = _by_name(doctor())
    assert _cpuinfo("model name") in checks["cpu"].detail
    flags = set(_cpuinfo("flags").split())
    native = bool(flags & {"amx_bf16", "avx512_bf16"})
    detail = checks["cpu"].detail
    assert ("no native bf16" in detail) == (not native)
    assert (f"native bf16 ({'amx_bf16' if 'amx_bf16' in flags else 'avx512_bf16'}" in detail) == native
    if torch.cuda.is_available():
        assert checks["gpu 0"].detail.startswith(torch.cuda.get_device_name(0))
    else:
        assert checks["gpu"].status == OK and "training runs on the CPU" in checks["gpu"].detail
    assert "RAM" in checks["memory"].detail and "physical core" in checks["cores"].detail
    import importlib.metadata

    # a bug report's versions: the ones whose APIs move between releases
    for name in ("transformers", "peft", "accelerate"):
        assert f"{name} {importlib.metadata.version(name)}" in checks["packages"].detail


def test_a_busy_port_fails_with_a_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        check = check_port(port)
        assert check.status == FAIL and f"127.0.0.1:{port} is in use" in check.detail
        assert f"--port {port + 1}" in check.fix
    assert check_port(port).status == OK  # closed again


def _config(tiny_config, tmp_path: Path) -> Path:
    tiny_config["train"].update(max_steps=10, save_interval=5)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    return path


def test_a_full_disk_fails_with_a_fix(tiny_config, tmp_path, monkeypatch):
    import shutil

    from rlft.doctor import run_checks

    path = _config(tiny_config, tmp_path)
    report = doctor(str(path))
    disk = _by_name(report)["disk"]
    assert disk.status == OK and "2 checkpoint(s)" in disk.detail
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(run_checks.shutil, "disk_usage", lambda p: usage._replace(free=1024))
    disk = _by_name(doctor(str(path)))["disk"]
    assert disk.status == FAIL and "0.0 GiB free" in disk.detail
    assert "train.save_optimizer=false" in disk.fix and "train.keep_last=1" in disk.fix


def test_checkpoint_size_counts_weights_and_optimizer_state(tiny_config, tmp_path):
    from rlft.config.loader import load_config
    from rlft.planner.disk import checkpoint_bytes
    from rlft.planner.shape import model_shape

    cfg = load_config(data=tiny_config)
    shape = model_shape(cfg.model)
    assert checkpoint_bytes(cfg, shape) == 12 * shape.params
    cfg.train.save_optimizer = False
    assert checkpoint_bytes(cfg, shape) == 4 * shape.params


def test_the_best_model_is_counted_on_disk_weights_only(tiny_config, tmp_path):
    from rlft.config.loader import load_config
    from rlft.planner.disk import disk_plan
    from rlft.planner.shape import model_shape

    tiny_config["train"].update(save_interval=5, save_best=True)
    cfg = load_config(data=tiny_config)
    shape = model_shape(cfg.model)
    plan = disk_plan(cfg, shape, 10)
    assert (plan.kept, plan.checkpoint_bytes, plan.best_bytes) == (2, 12 * shape.params, 4 * shape.params)
    assert (
        plan.total
        == disk_plan(
            cfg.model_copy(update={"train": cfg.train.model_copy(update={"save_best": False})}), shape, 10
        ).total
        + 4 * shape.params
    )
    report = _by_name(doctor(str(_config(tiny_config, tmp_path))))["disk"]
    assert "2 checkpoint(s) of" in report.detail and "and the best model of" in report.detail


def test_a_broken_config_and_a_missing_tracker_fail(tiny_config, tmp_path, monkeypatch):
    import importlib.util

    tiny_config["algorithm"]["learning_rate"] = -1
    bad = _config(tiny_config, tmp_path)
    check = _by_name(doctor(str(bad)))["config"]
    assert check.status == FAIL and "algorithm.learning_rate" in check.detail
    tiny_config["algorithm"]["learning_rate"] = 1e-3
    tiny_config["train"]["report_to"] = ["wandb"]
    path = _config(tiny_config, tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    check = _by_name(doctor(str(path)))["tracker wandb"]
    assert check.status == FAIL and check.fix == "pip install 'rlft[trackers]'"


def test_cli_json_and_exit_code(tiny_config, tmp_path):
    path = _config(tiny_config, tmp_path)
    proc = run_cli(["doctor", "--config", str(path), "--json", "--port", "0"], tmp_path)
    out = json.loads(proc.stdout)
    names = {c["name"] for c in out["checks"]}
    assert {"python", "torch", "cpu", "memory", "disk", "memory plan", "config", "service port"} <= names
    assert proc.returncode == (0 if out["ok"] else 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = run_cli(["doctor", "--port", str(s.getsockname()[1])], tmp_path)
    assert proc.returncode == 1 and "[FAIL] service port" in proc.stdout and "fix:" in proc.stdout


def test_model_compile_without_a_compiler_warns_with_a_fix(tiny_config, tmp_path, monkeypatch):
    """model.compile on a CPU needs a C++ compiler for Inductor: found, the check says which; missing, it warns
    (the run would go on uncompiled) and says what to install. Nothing is asked, nothing is checked."""
    from torch._inductor import cpp_builder

    assert "compile" not in _by_name(doctor(str(_config(tiny_config, tmp_path))))
    tiny_config["model"]["compile"] = True
    path = _config(tiny_config, tmp_path)
    check = _by_name(doctor(str(path)))["compile"]
    assert check.status == OK and "model.compile: Inductor compiles with" in check.detail

    def missing():
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    check = _by_name(doctor(str(path)))["compile"]
    assert check.status == "warn" and "no working C++ compiler found" in check.detail
    assert "install g++" in check.fix
