"""``check_env()``: what this machine offers rlft, in one call."""

from __future__ import annotations

import importlib.util
import os
import platform


def check_env(verbose: bool = False) -> dict:
    """Report Python, torch, devices, bf16 support, threads and optional packages.

    Returns a dict; ``ok`` is False only if something rlft needs is missing.
    """
    import torch

    from rlft.doctor.machine import REQUIRED, cpu_model, package_versions
    from rlft.models.precision import bf16_matmul_speedup, cpu_has_native_bf16
    from rlft.speed.threads import physical_cores

    info: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count(),
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "bf16_cpu": _cpu_bf16(),
        "bf16_cpu_native": cpu_has_native_bf16(),
        "bf16_cpu_speedup": bf16_matmul_speedup(),  # bf16 over fp32 matmul throughput, measured; None: emulated
        "cpu_model": cpu_model(),
    }
    from rlft.speed.kernels import cpu_kernels, unavailable_reason

    kernels = cpu_kernels()  # built here on first use (about a second), then cached for the machine
    info["native_kernels"] = kernels.describe() if kernels is not None else f"unavailable: {unavailable_reason()}"
    info["gpu_compile"] = _gpu_compile() if info["cuda_available"] else None
    cores = physical_cores()
    info["physical_cores"] = cores
    # rlft's trainer sets one thread per physical core (rlft.speed.threads); this says what torch does unset
    info["thread_warning"] = (
        f"torch uses {info['cpu_threads']} threads on {cores} physical cores this process may "
        f"use; rlft train sets {cores} (train.num_threads)"
        if info["cpu_threads"] > cores
        else None
    )
    optional = ["vllm", "ray", "wandb", "mlflow", "trl", "fastapi", "uvicorn", "sqlalchemy", "matplotlib", "plotly"]
    info["missing_required"] = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    info["optional"] = {m: importlib.util.find_spec(m) is not None for m in optional}
    info["versions"] = package_versions()
    info["ok"] = not info["missing_required"]
    if verbose:
        _print(info)
    return info


def _print(info: dict) -> None:
    """:func:`check_env`'s report, a line per subject."""
    device = ", ".join(info["gpu_names"]) if info["cuda_available"] else "CPU"
    print(
        f"python {info['python']} | torch {info['torch']} | device: {device} | "
        f"CUDA available: {info['cuda_available']} | GPUs: {info['gpu_count']}"
    )
    print(
        f"CPU threads: {info['cpu_threads']} of {info['cpu_count']} cores | bf16 on CPU: {info['bf16_cpu']} "
        f"({_bf16_verdict(info['bf16_cpu_speedup'])})"
    )
    if info["thread_warning"]:
        print("WARNING: " + info["thread_warning"])
    print(f"CPU kernels: {info['native_kernels']}")
    if info["gpu_compile"]:
        print(f"torch.compile on the GPU (rollout.compile_decode, model.compile): {info['gpu_compile']}")
    versions = info["versions"]
    print(
        "required packages: "
        + ("all present" if info["ok"] else "MISSING " + ", ".join(info["missing_required"]))
        + " ("
        + ", ".join(f"{k} {v}" for k, v in versions.items() if k not in info["optional"])
        + ")"
    )
    print("optional: " + ", ".join(f"{k} {versions.get(k, 'yes') if v else 'no'}" for k, v in info["optional"].items()))
    print(f"CPU: {info['cpu_model']}; disk, the service port and a run's memory plan: rlft doctor [--config X]")


def _gpu_compile() -> str:
    """Whether torch.compile can make GPU kernels here: Inductor writes them in Triton."""
    try:
        import triton
    except ImportError:
        return "no Triton, so the decode layers run as PyTorch's eager ops (pip install triton)"
    return f"Triton {triton.__version__}"


def _cpu_bf16() -> bool:
    try:
        import torch

        a = torch.ones(4, 4, dtype=torch.bfloat16)
        return bool(torch.isfinite(a @ a).all())
    except Exception:
        return False


def _bf16_verdict(speedup: float | None) -> str:
    from rlft.models.precision import BF16_PAYS

    if speedup is None:
        return "emulated: rlft computes in fp32 on this CPU"
    pays = (
        "model.dtype auto computes in bf16"
        if speedup >= BF16_PAYS
        else "slower than fp32: model.dtype auto computes in fp32"
    )
    return f"native, matmuls measured {speedup:.2f}x fp32's speed; {pays}"
