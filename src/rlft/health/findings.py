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
    key(s) to turn. ``metrics``: the metric keys behind it (what the report plots). ``recovered_step``:
    where the check saw the problem gone again (held-out accuracy back within noise of its best), else
    None; a check reports that with a finding of its own whose ``recovered_step`` is set."""

    check: str
    step: int
    severity: str
    message: str
    knob: str
    metrics: tuple[str, ...] = ()
    last_step: int | None = None
    count: int = 1
    recovered_step: int | None = None

    @property
    def standing(self) -> str | None:
        """The severity it leaves the run with: its own, one lower once it recovered (an unhealthy
        stretch the run came back from is still worth a look; a warning that cleared is not)."""
        if self.recovered_step is None:
            return self.severity
        return "warning" if self.severity == "unhealthy" else None

    def line(self) -> str:
        """The one-line form: the log's and the terminal's."""
        until = f" (still at step {self.last_step})" if self.last_step not in (None, self.step) else ""
        if self.recovered_step is not None:
            until = f" (recovered at step {self.recovered_step})"
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
    """``unhealthy`` if any finding stands so (:attr:`Finding.standing`), ``warnings`` if only warnings
    stand, else ``healthy``."""
    severities = {f.standing for f in findings} - {None}
    return "unhealthy" if "unhealthy" in severities else "warnings" if severities else "healthy"


def conclusion(findings) -> str:
    """The closing log line of a run: healthy, or which checks make it not (unhealthy ones first), and
    the warnings it recovered from."""
    findings = list(findings)
    if not findings:
        return "finished, healthy: no health check fired"
    cleared = "; ".join(
        f"{f.check} at step {f.step}, recovered at step {f.recovered_step}" for f in findings if f.standing is None
    )
    standing = [f for f in findings if f.standing is not None]
    if not standing:
        return f"finished, healthy: {cleared} (rlft diagnose RUN_DIR writes the report)"
    worst = [f for f in standing if f.standing == "unhealthy"] or standing
    what = "; ".join(
        f"{f.check} from step {f.step}" + (f" (recovered at step {f.recovered_step})" if f.recovered_step else "")
        for f in worst[:4]
    )
    head = "finished, but unhealthy" if verdict_of(findings) == "unhealthy" else "finished with health warnings"
    return f"{head}: {what}{f'; recovered: {cleared}' if cleared else ''} (rlft diagnose RUN_DIR writes the report)"
