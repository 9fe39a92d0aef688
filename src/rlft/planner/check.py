"""The memory check every run passes before it loads a weight.

A config predicted not to fit its device is refused with the estimate and the knobs that would
make it fit (``--set train.ignore_memory_check=true`` starts it anyway). A run that fits records
its plan in run.json (``memory``): the prediction, and what to turn down first should memory run
out after all, which the resource monitor's warning and an OOM report quote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlft.errors import UsageError
from rlft.planner.devices import GiB

# If a run dies of OOM, the advice is what would bring its predicted peak this far below it.
OOM_MARGIN = 0.8


class MemoryPlanError(UsageError):
    """The run is predicted not to fit the device's memory (exit code 2, like a config error)."""


@dataclass
class MemoryPlan:
    """What run.json's ``memory`` holds: the predicted peak and its phase, the device, and the knobs
    (``--set`` settings, least costly first) that lower the peak if memory runs out."""

    peak_bytes: int
    peak_phase: str
    device: str
    device_bytes: int
    if_out_of_memory: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "predicted_peak_mb": round(self.peak_bytes / 2**20),
            "peak_phase": self.peak_phase,
            "device": self.device,
            "device_mb": round(self.device_bytes / 2**20),
            "if_out_of_memory": self.if_out_of_memory,
        }


def check_memory(cfg, log, processes: int = 1, sharded: bool = False) -> MemoryPlan | None:
    """Estimate ``cfg``'s peak on the device it trains on; refuse it (:class:`MemoryPlanError`) when it
    will not fit, unless ``train.ignore_memory_check``. None when no estimate could be made (the model
    cannot be read yet; loading it reports why). ``processes``/``sharded``: one process of a
    data-parallel run (:func:`rlft.planner.estimate.estimate_memory`)."""
    from dataclasses import replace

    from rlft.errors import RlftError
    from rlft.planner.advice import advise
    from rlft.planner.estimate import estimate_memory, gb

    try:
        est = estimate_memory(cfg, processes=processes, sharded=sharded)
    except (RlftError, OSError, ValueError, KeyError) as exc:
        log.warning(f"memory check skipped: could not estimate this run's memory ({type(exc).__name__}: {exc})")
        return None
    for path, value in est.settings.items():  # what the plan decided of an 'auto' setting, and why
        section, key = path.split(".")
        setattr(getattr(cfg, section), key, value)
        log.info("memory plan: " + "; ".join(n for n in est.notes if n.startswith(path)))
    if not est.fits:
        knobs = advise(cfg, est)
        lines = "\n".join(f"  {line}" for line in est.lines())
        steps = "\n".join(f"  {i}. --set {k.setting}  -> {gb(k.peak)}  ({k.cost})" for i, k in enumerate(knobs, 1))
        advice = (
            f"To fit, apply in this order (each peak includes the changes above it):\n{steps}"
            if knobs
            else "No knob rlft knows brings it under the limit: use a device with more memory."
        )
        message = (
            f"this run is predicted to need {gb(est.peak)} at its peak ({est.peak_phase}), more than the "
            f"{gb(est.limit)} {est.device.name} can give it:\n{lines}\n{advice}\n"
            f"(rlft estimate --config ... shows this again; --set train.ignore_memory_check=true starts "
            f"the run anyway)"
        )
        if not cfg.train.ignore_memory_check:
            raise MemoryPlanError(message)
        log.warning(message.replace("\n", " | "))
    smaller = replace(est.device, total=max(int(est.peak * OOM_MARGIN / 0.95), GiB // 4))
    try:
        knobs = advise(
            cfg,
            estimate_memory(
                cfg,
                smaller,
                shape=est.shape,
                prompt_tokens=est.geometry.prompt_tokens,
                processes=processes,
                sharded=sharded,
            ),
            max_knobs=3,
        )
    except Exception as exc:  # noqa: BLE001  (advice for a later OOM must never stop a run that fits)
        log.warning(f"memory plan: no advice for an out-of-memory failure ({type(exc).__name__}: {exc})")
        knobs = []
    return MemoryPlan(est.peak, est.peak_phase, est.device.name, est.device.total, [k.setting for k in knobs])
