"""The machine checks of ``rlft doctor``: Python, torch, GPUs, CPU and bf16, memory, packages, port."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL = "ok", "warn", "fail"
REQUIRED = ("transformers", "safetensors", "pydantic", "yaml", "gguf", "accelerate", "peft")
# the packages whose version decides what a bug report means (their APIs move between releases)
VERSIONED = ("transformers", "peft", "accelerate", "trl", "vllm")
# optional extra -> (import name, what it gives, how to install it)
EXTRAS = {
    "tensorboard": ("tensorboard", "train.report_to: [tensorboard]", "pip install 'rlft[trackers]'"),
    "wandb": ("wandb", "train.report_to: [wandb]", "pip install 'rlft[trackers]'"),
    "mlflow": ("mlflow", "train.report_to: [mlflow]", "pip install 'rlft[trackers]'"),
    "service": ("fastapi", "rlft serve, rlft serve-reward, rlft sweep", "pip install 'rlft[service]'"),
    "ray": ("ray", "rlft sweep --backend ray", "pip install ray"),
    "vllm": ("vllm", "rollout.engine: vllm (GPU)", "pip install 'rlft[vllm]'"),
    "nvml": ("pynvml", "GPU utilisation in resources.jsonl", "pip install nvidia-ml-py"),
}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info < (3, 11):  # noqa: UP036 - a source checkout can be run by any Python
        return Check("python", FAIL, version, "rlft needs Python 3.11 or newer")
    return Check("python", OK, f"{version} ({sys.executable})")


def check_torch() -> Check:
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    return Check("torch", OK, f"{torch.__version__}, {build}")


def check_gpus() -> list[Check]:
    import torch

    if not torch.cuda.is_available():
        hint = "this torch build has CUDA but no GPU is visible" if torch.version.cuda else "none"
        return [Check("gpu", OK, f"{hint}: training runs on the CPU")]
    out = [
        Check(
            "cuda", OK, f"CUDA {torch.version.cuda}, driver {_driver_version()}, {torch.cuda.device_count()} device(s)"
        )
    ]
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        bf16 = "bf16" if torch.cuda.is_bf16_supported() else "no bf16 (fp16/fp32 only)"
        out.append(
            Check(
                f"gpu {i}",
                OK if free > 0.5 * total else WARN,
                f"{props.name}, {_gb(total)} ({_gb(free)} free), {bf16}",
                None
                if free > 0.5 * total
                else "another process holds most of this GPU's memory (nvidia-smi shows which)",
            )
        )
    return out


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001
        import subprocess

        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            return "unknown"


def _cpuinfo(field: str) -> str:
    """The first ``field`` line of /proc/cpuinfo ('' where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def check_cpu() -> list[Check]:
    import psutil

    from rlft.models.precision import BF16_PAYS, bf16_matmul_speedup
    from rlft.planner.devices import cpu_memory_limit
    from rlft.speed.kernels.build import cpu_has
    from rlft.speed.threads import physical_cores

    speedup = bf16_matmul_speedup()
    flags = [f for f in ("amx_bf16", "avx512_bf16") if cpu_has(f)]
    if speedup is None:
        bf16 = "no native bf16 (no amx_bf16 / avx512_bf16): a bf16 config computes in fp32 on this CPU"
    elif speedup >= BF16_PAYS:
        bf16 = (
            f"native bf16 ({', '.join(flags)}), matmuls measured {speedup:.1f}x fp32's speed: model.dtype "
            f"auto and bf16 compute in bf16"
        )
    else:
        bf16 = (
            f"native bf16 ({', '.join(flags)}) but matmuls measured {speedup:.2f}x fp32's speed: model.dtype "
            f"auto computes in fp32, which is faster here"
        )
    out = [Check("cpu", OK, f"{cpu_model()}; {bf16}")]
    cores, logical = physical_cores(), psutil.cpu_count(logical=True)
    out.append(
        Check(
            "cores",
            OK,
            f"{cores} physical core(s) this process may use, {logical} logical; rlft trains with {cores} thread(s)",
        )
    )
    mem, limit = psutil.virtual_memory(), cpu_memory_limit()
    cap = f", cgroup limit {_gb(limit)}" if limit < mem.total else ""
    status = OK if mem.available >= 2 * 2**30 else WARN
    out.append(
        Check(
            "memory",
            status,
            f"{_gb(mem.total)} RAM, {_gb(mem.available)} available{cap}",
            None if status == OK else "less than 2 GB is free: close other programs, or expect an OOM",
        )
    )
    return out


def package_versions() -> dict[str, str]:
    """The installed version of each of :data:`VERSIONED` that is installed."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def check_packages() -> list[Check]:
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    out = [
        Check(
            "packages",
            FAIL if missing else OK,
            f"missing {', '.join(missing)}" if missing else f"every required package is installed ({versions})",
            "pip install -e . (or pip install rlft) in this environment" if missing else None,
        )
    ]
    present = [name for name, (module, _, _) in EXTRAS.items() if importlib.util.find_spec(module) is not None]
    absent = [name for name in EXTRAS if name not in present]
    out.append(Check("extras", OK, f"present: {', '.join(present) or 'none'}; absent: {', '.join(absent) or 'none'}"))
    return out


def check_port(port: int, host: str = "127.0.0.1") -> Check:
    """Whether ``rlft serve`` could listen on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return Check(
                "service port",
                FAIL,
                f"{host}:{port} is in use ({exc.strerror or exc})",
                f"stop what listens there, or use rlft serve --port {port + 1} (and rlft doctor --port {port + 1})",
            )
    return Check("service port", OK, f"{host}:{port} is free for rlft serve")


def machine_checks(port: int) -> list[Check]:
    return [check_python(), check_torch(), *check_gpus(), *check_cpu(), *check_packages(), check_port(port)]
