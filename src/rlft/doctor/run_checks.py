"""The checks of ``rlft doctor --config X``: the config validates, its model can be read, the run fits
in memory, and what it writes fits on the disk of its output folder."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from rlft.doctor.machine import EXTRAS, FAIL, OK, WARN, Check, _gb


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    path = path.expanduser().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def config_checks(config_path: str, overrides: list[str] | None = None) -> list[Check]:
    from rlft.config.loader import load_config
    from rlft.errors import ConfigError, RlftError

    try:
        cfg = load_config(config_path, overrides=overrides or [])
    except ConfigError as exc:
        return [
            Check(
                "config",
                FAIL,
                f"{config_path}: {len(exc.problems)} problem(s): " + "; ".join(exc.problems),
                f"fix those keys (rlft validate --config {config_path} lists them again)",
            )
        ]
    except RlftError as exc:
        return [Check("config", FAIL, str(exc), "fix the file or the --set values")]
    out = [Check("config", OK, f"{config_path} is a valid {cfg.kind} config")]
    out += _tracker_checks(cfg)
    try:
        from rlft.planner.shape import model_shape

        shape = model_shape(cfg.model)
    except (RlftError, OSError, ValueError) as exc:
        return out + [
            Check(
                "model",
                FAIL,
                f"{cfg.model.path}: {exc}",
                "point model.path at a Hugging Face model folder, a .gguf file or a built-in name",
            )
        ]
    out.append(Check("model", OK, f"{cfg.model.path}: {shape.model_type}, {shape.params / 1e6:.1f}M parameters"))
    out.append(_memory_check(cfg, shape, config_path))
    out.append(disk_check(cfg, shape))
    return out + _compile_checks(cfg)


def _tracker_checks(cfg) -> list[Check]:
    out = []
    for name in cfg.train.report_to:
        module, _, install = EXTRAS[name]
        if importlib.util.find_spec(module) is None:
            out.append(Check(f"tracker {name}", FAIL, f"train.report_to lists {name}, which is not installed", install))
    return out


def _compile_checks(cfg) -> list[Check]:
    """Whether this machine can compile what ``model.compile`` and ``rollout.compile_decode`` ask for: Triton on a
    GPU, a C++ compiler on a CPU (where compiling fails a run goes on uncompiled, which only its log says)."""
    from rlft.models.loading import resolve_device

    gpu = resolve_device(cfg.model.device).type == "cuda"
    rollout = getattr(cfg, "rollout", None)
    asked = ["model.compile"] if cfg.model.compile else []
    # on a CPU the decode is rlft's native kernels': rollout.compile_decode has nothing to compile there
    if gpu and rollout is not None and rollout.compile_decode:
        asked.append("rollout.compile_decode")
    if not asked:
        return []
    what = " and ".join(asked)
    if gpu:
        if importlib.util.find_spec("triton") is None:
            return [Check("compile", WARN, f"{what}: no Triton here, so nothing compiles", "pip install triton")]
        return [Check("compile", OK, f"{what}: Triton found (compiling takes up to a minute at a run's first steps)")]
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        compiler = get_cpp_compiler()
    except Exception as exc:  # Inductor's own search: RuntimeError, or its missing-compiler error
        return [
            Check(
                "compile",
                WARN,
                f"{what}: no C++ compiler for Inductor on this CPU ({exc}); the layers would run uncompiled",
                "install g++ (or set CXX), or set model.compile false",
            )
        ]
    return [Check("compile", OK, f"{what}: Inductor compiles with {compiler} on this CPU")]


def _memory_check(cfg, shape, config_path: str) -> Check:
    from rlft.planner.advice import advise
    from rlft.planner.estimate import estimate_memory, gb

    est = estimate_memory(cfg, shape=shape)
    detail = f"predicted peak {gb(est.peak)} ({est.peak_phase}) of {gb(est.device.total)} on {est.device.name}"
    if est.fits:
        return Check("memory plan", OK, detail)
    knobs = advise(cfg, est)
    fix = (
        "; then ".join(f"--set {k.setting} ({gb(k.peak)})" for k in knobs[:3])
        if knobs
        else "use a device with more memory"
    ) + f" (rlft estimate --config {config_path} shows the breakdown)"
    return Check("memory plan", FAIL, detail + ": does not fit", fix)


def disk_check(cfg, shape) -> Check:
    """Free space in ``train.output_dir`` against the checkpoints the run keeps."""
    from rlft.planner.disk import disk_plan, planned_steps

    plan = disk_plan(cfg, shape, planned_steps(cfg))
    out_dir = Path(cfg.train.output_dir)
    free = free_bytes(out_dir)
    detail = (
        f"{out_dir}: {_gb(free)} free; the run writes up to {_gb(plan.total)} ({plan.kept} checkpoint(s) of "
        f"{_gb(plan.checkpoint_bytes)}{'' if cfg.train.save_optimizer else ', without optimizer state'}"
        f"{f', and the best model of {_gb(plan.best_bytes)}' if plan.best_bytes else ''})"
    )
    fixes = []
    if cfg.train.save_optimizer and cfg.model.lora is None:
        fixes.append("train.save_optimizer=false (export-only checkpoints, a third of the size; no resume)")
    if not cfg.train.keep_last or cfg.train.keep_last > 1:
        fixes.append("train.keep_last=1")
    fix = (
        "free space, choose another train.output_dir, or --set " + " / --set ".join(fixes)
        if fixes
        else "free space or choose another train.output_dir"
    )
    if free < plan.total:
        return Check("disk", FAIL, detail, fix)
    if free < 2 * plan.total:
        return Check("disk", WARN, detail + " (less than twice that is free)", fix)
    return Check("disk", OK, detail)
