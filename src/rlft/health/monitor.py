"""The health monitor: every registered check over one run's metric stream, live or replayed.

Each check says, row by row, whether its problem holds. The monitor keeps one finding per check (the
step it was first seen, the latest message, the worst severity) and says it in the log the first
time, when it gets worse, and again every ``repeat_every`` steps while it persists: a run with no
learning signal keeps saying so. ``stop_reason`` tells the trainer when ``stop_on_no_signal`` asks
it to stop.
"""

from __future__ import annotations

import dataclasses
import logging

from rlft.config.schema import HealthConfig
from rlft.health.checks import CHECKS, Check
from rlft.health.findings import Finding, conclusion, verdict_of
from rlft.health.stream import Stream


class HealthMonitor:
    """``thresholds``: ``train.health``; ``task_reward``: the reward that is the task (see
    :class:`~rlft.health.checks.learning.RewardDominance`); ``log``: where findings are said (None:
    nowhere); ``checks``: names from :data:`CHECKS` to run (default all)."""

    def __init__(
        self,
        thresholds: HealthConfig | None = None,
        task_reward: str | None = None,
        log: logging.Logger | None = None,
        checks: list[str] | None = None,
    ):
        self.t = thresholds or HealthConfig()
        self.log = log
        unknown = sorted(set(checks or ()) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown health checks {unknown}; known: {sorted(CHECKS)}")
        self.checks: dict[str, Check] = {n: CHECKS[n](self.t, task_reward) for n in (checks or CHECKS)}
        self.stream = Stream(self.t.window)
        self._findings: dict[str, Finding] = {}
        self._said: dict[str, int] = {}  # check -> step it was last said at
        self._step = 0

    # ------------------------------------------------------------------ feeding

    def observe_step(self, step: int, metrics: dict, span: int = 1) -> list[Finding]:
        """One row of metrics at ``step`` (``span``: the steps it averages; 1 live). Returns the findings
        said now (new, worse, or repeated because they persist)."""
        self._step = step
        self.stream.add(step, metrics, span)
        return self._record([c.on_step(step, metrics, span, self.stream) for c in self.checks.values()])

    def observe_eval(
        self, step: int, accuracy: float | None, num_prompts: int | None = None, rewards: dict | None = None
    ) -> list[Finding]:
        """A held-out evaluation at ``step``: its accuracy over ``num_prompts`` prompts, and each reward's
        mean over its completions (``rewards``, where known)."""
        if accuracy is None:
            return []
        seen = [c.on_eval(step, accuracy, num_prompts, self.stream, rewards) for c in self.checks.values()]
        return self._record(seen)

    def observe_end(self, step: int) -> list[Finding]:
        """The run ended after ``step`` (completed, or stopped itself): the checks that judge the whole run."""
        return self._record([c.on_end(step, self.stream) for c in self.checks.values()])

    def _record(self, seen: list[Finding | None]) -> list[Finding]:
        said = []
        for f in seen:
            if f is None:
                continue
            old = self._findings.get(f.check)
            if f.recovered_step is not None:  # the problem is gone: said once, kept on the finding
                if old is not None and old.recovered_step is None:
                    self._findings[f.check] = dataclasses.replace(old, recovered_step=f.recovered_step)
                    said.append(self._findings[f.check])
                    if self.log is not None:
                        self.log.info(f"health, step {f.step} [{f.check}]: recovered: {f.message}")
                continue
            if old is None:
                merged = f
            else:  # the first step stays; the latest message and the worst severity win
                severity = "unhealthy" if "unhealthy" in (old.severity, f.severity) else "warning"
                merged = dataclasses.replace(f, step=old.step, severity=severity, count=old.count + 1)
            merged = dataclasses.replace(merged, last_step=f.step)
            self._findings[f.check] = merged
            worse = old is not None and old.severity != merged.severity
            again = old is not None and old.recovered_step is not None  # back after it had recovered
            if old is None or worse or again or f.step - self._said.get(f.check, f.step) >= self.t.repeat_every:
                self._said[f.check] = f.step
                said.append(merged)
                self._say(merged, f.step)
        return said

    def _say(self, finding: Finding, step: int) -> None:
        if self.log is None:
            return
        first = f" (since step {finding.step})" if finding.step != step else ""
        self.log.warning(f"health, step {step}{first} [{finding.check}]: {finding.message}. Knob: {finding.knob}")

    # ------------------------------------------------------------------ reading

    @property
    def findings(self) -> list[Finding]:
        """One finding per check that fired: those standing unhealthy first, those the run recovered from
        last, each group by the step first seen."""
        return sorted(
            self._findings.values(), key=lambda f: (f.standing != "unhealthy", f.standing is None, f.step, f.check)
        )

    @property
    def verdict(self) -> str:
        return verdict_of(self._findings.values())

    def summary(self) -> dict:
        """What run.json and the eval files keep: the verdict and the findings."""
        return {"verdict": self.verdict, "findings": [f.as_dict() for f in self.findings]}

    def stop_reason(self) -> str | None:
        """Why the run should stop now (``stop_on_no_signal`` reached), else None."""
        limit, check = self.t.stop_on_no_signal, self.checks.get("no_signal")
        if limit is None or check is None or check.streak < limit:
            return None
        return (
            f"no learning signal for {check.streak} steps in a row (train.health.stop_on_no_signal="
            f"{limit}); knob: {check.knob}"
        )

    def conclusion(self) -> str:
        """The closing log line: healthy, or what makes it not."""
        return conclusion(self.findings)
