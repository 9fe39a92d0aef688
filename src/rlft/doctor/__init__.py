"""``rlft doctor``: whether this machine (and, with ``--config``, this run) is ready, check by check.

    >>> from rlft.doctor import doctor
    >>> report = doctor(config="configs/minimal_example.yaml")
    >>> report.ok, [c.name for c in report.failed]

Each :class:`Check` is ok, warn or fail, with a one-line fix for the last two; any fail makes
``rlft doctor`` exit 1. ``check_env()`` (the user's document) is :func:`doctor` without a config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rlft.doctor.machine import FAIL, OK, WARN, Check, machine_checks

DEFAULT_PORT = 8000

__all__ = ["Check", "DoctorReport", "doctor", "OK", "WARN", "FAIL"]


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}

    def lines(self) -> list[str]:
        marks = {OK: "[ ok ]", WARN: "[warn]", FAIL: "[FAIL]"}
        out = []
        for c in self.checks:
            out.append(f"{marks[c.status]} {c.name}: {c.detail}")
            if c.fix and c.status != OK:
                out.append(f"       fix: {c.fix}")
        n_warn = sum(c.status == WARN for c in self.checks)
        out.append(f"{len(self.failed)} failed, {n_warn} warning(s), {len(self.checks)} checks")
        return out


def doctor(config: str | None = None, overrides: list[str] | None = None, port: int = DEFAULT_PORT) -> DoctorReport:
    """Run the machine checks and, with ``config``, the run's checks."""
    checks = machine_checks(port)
    if config is not None:
        from rlft.doctor.run_checks import config_checks

        checks += config_checks(config, overrides)
    return DoctorReport(checks)
