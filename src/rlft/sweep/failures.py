"""Why a sweep run failed, in one word, and whether trying it again can help.

    classify(read_run_info(run_dir), exit_code, run_dir)   # -> "data", "transient", "killed" ...

The run's own record comes first: a process that failed records ``error_type`` in run.json
(:func:`rlft.errors.error_type`), which knows the exception. Only a process that died without a
record is told by its exit code: 2 is a usage/config error (argparse and :class:`ConfigError` exit
2), a signal (SIGKILL: -9 as ``subprocess`` reports it, 137 as a shell does) is ``oom`` when the run's
resource log says memory was nearly exhausted and ``killed`` otherwise.

Torch-free, no process handling: only dictionaries and numbers in, a class out.
"""

from __future__ import annotations

from pathlib import Path

FAILURE_CLASSES = (
    "config_invalid",
    "data",
    "reward",
    "environment",
    "oom",
    "disk_full",
    "killed",
    "transient",
    "unknown",
)

# What a failure of each class says about a second try (docs/sweeps.md repeats this table).
RETRY_HINT = {
    "config_invalid": "never retried: the same config fails the same way",
    "data": "never retried: the data file is broken until someone fixes it",
    "reward": "never retried: a bug in the reward function fails again",
    "environment": "not retried by default: an environment that fails to load fails again",
    "oom": "not retried by default: the same batch needs the same memory",
    "disk_full": "not retried by default: free space first (or set train.keep_last); --resume continues it",
    "killed": "not retried by default; --resume continues it (an interrupted sweep ends its runs this way)",
    "transient": "retried: a network or infrastructure blip (connection reset, timeout) may pass",
    "unknown": "not retried by default: an unclassified error (read errors.md)",
}
NEVER_RETRIED = frozenset({"config_invalid", "data", "reward"})
DEFAULT_RETRY_ON = ("transient",)

# run.json error_types of the job service that are not classes of their own here
_ALIASES = {"service_lost": "killed"}


def classify(info: dict, exit_code: int | None, run_dir: str | Path | None = None) -> str:
    """The failure class of a run that did not succeed: from run.json's record (``info``) if the
    process wrote one, else from ``exit_code`` (negative: the signal that ended it)."""
    if info.get("status") == "failed" and info.get("error_type"):
        recorded = _ALIASES.get(info["error_type"], info["error_type"])
        return recorded if recorded in FAILURE_CLASSES else "unknown"
    if exit_code == 2:
        return "config_invalid"
    signal_number = _signal_of(exit_code)
    if signal_number is not None:
        return "oom" if signal_number == 9 and run_dir is not None and memory_exhausted(run_dir) else "killed"
    if exit_code is None and info.get("status") in ("starting", "running"):
        return "killed"  # ended while nobody watched it, without recording an outcome
    return "unknown"


def _signal_of(exit_code: int | None) -> int | None:
    """The signal that ended a process: -9 (``subprocess``) and 137 (a shell, the job store) are both 9."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if exit_code > 128:
        return exit_code - 128
    return None


def kill_diagnosis(run_dir: str | Path) -> dict | None:
    """What the run's resource log says of a SIGKILL: run.json-style fields (``error_type: oom``,
    ``error``) when memory was nearly exhausted, else None (:func:`rlft.logging.resources.diagnose_kill`;
    None as well where its samples are missing)."""
    from rlft.logging.resources import diagnose_kill

    try:
        verdict = diagnose_kill(Path(run_dir))
    except Exception:  # a diagnosis that cannot be made is no diagnosis
        return None
    return verdict if isinstance(verdict, dict) else None


def memory_exhausted(run_dir: str | Path) -> bool:
    return (kill_diagnosis(run_dir) or {}).get("error_type") == "oom"


def retryable(failure_class: str, retry_on: tuple[str, ...]) -> bool:
    """Whether a failure of this class is tried again: it is in ``retry_on`` and not a class that
    can never pass on a second try."""
    return failure_class in retry_on and failure_class not in NEVER_RETRIED


def parse_retry_on(text: str) -> tuple[str, ...]:
    """``--retry-on transient,killed`` -> the classes; ValueError naming a class that is not one or
    that is never retried."""
    classes = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    bad = [c for c in classes if c not in FAILURE_CLASSES]
    if bad:
        raise ValueError(f"--retry-on: {', '.join(bad)} is not a failure class ({', '.join(FAILURE_CLASSES)})")
    never = [c for c in classes if c in NEVER_RETRIED]
    if never:
        raise ValueError(f"--retry-on: {', '.join(never)} is never retried ({RETRY_HINT[never[0]]})")
    return classes
