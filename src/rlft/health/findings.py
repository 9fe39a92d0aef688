"""What a health check reports: a finding, and the verdict a run's findings add up to."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# "unhealthy": the run is not learning what it should (or its numbers broke); "warning": worth a look.
SEVERITIES = ("warning", "unhealthy")
VERDICTS = ("healthy", "warnings", "unhealthy")
# The exit code of an unhealthy verdict (rlft diagnose; rlft train with train.health.fail_on_unhealthy):
# distinct from 1 (a failure) and 2 (a usage, config or data error).
EXIT_UNHEALTHY = 3


@dataclass(frozen=True)
class Finding:
    """One problem a check saw.

    ``step``: where it was first seen; ``last_step``: where it was last seen (a problem that persists
    is said again, and its finding keeps the first step and the latest message). ``knob``: the config
    key(s) to turn. ``metrics``: the metric keys behind it (what the report plots)."""

    check: str
    step: int
    severity: str
    message: str
    knob: str
    metrics: tuple[str, ...] = ()
    last_step: int | None = None
    count: int = 1

    def line(self) -> str:
        """The one-line form: the log's and the terminal's."""
        until = f" (still at step {self.last_step})" if self.last_step not in (None, self.step) else ""
        return f"step {self.step}{until} [{self.check}, {self.severity}]: {self.message} (knob: {self.knob})"

    def as_dict(self) -> dict:
        out = asdict(self)
        out["metrics"] = list(self.metrics)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Finding:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**{**fields, "metrics": tuple(fields.get("metrics", ()))})


def verdict_of(findings) -> str:
    """``unhealthy`` if any finding is, ``warnings`` if there are only warnings, else ``healthy``."""
    severities = {f.severity for f in findings}
    return "unhealthy" if "unhealthy" in severities else "warnings" if severities else "healthy"


def conclusion(findings) -> str:
    """The closing log line of a run: healthy, or which checks make it not (unhealthy ones first)."""
    findings = list(findings)
    if not findings:
        return "finished, healthy: no health check fired"
    worst = [f for f in findings if f.severity == "unhealthy"] or findings
    what = "; ".join(f"{f.check} from step {f.step}" for f in worst[:4])
    head = "finished, but unhealthy" if verdict_of(findings) == "unhealthy" else "finished with health warnings"
    return f"{head}: {what} (rlft diagnose RUN_DIR writes the report)"
