"""``rlft diagnose``: replay a run's logged metrics through the health monitor and write a report.

    diagnosis = diagnose("outputs/my-run")          # <run>/health/report.md and one PNG per finding
    diagnosis.verdict                               # "healthy" | "warnings" | "unhealthy"

The same :class:`~rlft.health.monitor.HealthMonitor` as the live checks, with the run's own
``train.health`` thresholds (from its config.yaml). ``metrics.jsonl`` has one row per
``train.logging_interval`` steps, each the mean of those steps: a row stands for all of them, so
streaks and windows are counted in steps as they are live (a spike inside an interval is averaged
away, so diagnose sees fewer of those than the live run did).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlft.config.schema import HealthConfig
from rlft.errors import UsageError
from rlft.health.findings import Finding
from rlft.health.monitor import HealthMonitor
from rlft.health.stream import finite
from rlft.logging.plots import RunData, load_run


@dataclass
class Diagnosis:
    run_dir: Path
    verdict: str
    findings: list[Finding]
    steps_logged: int
    evals: int
    report: Path | None = None
    plots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "run_dir": str(self.run_dir),
            "verdict": self.verdict,
            "findings": [f.as_dict() for f in self.findings],
            "steps_logged": self.steps_logged,
            "evals": self.evals,
            "report": str(self.report) if self.report else None,
            "plots": [str(p) for p in self.plots],
            "notes": self.notes,
        }


def run_settings(run_dir: Path) -> tuple[HealthConfig, str | None, list[str]]:
    """The run's ``train.health`` thresholds and task reward, from its config.yaml; the defaults (with
    a note saying so) when it has none or it cannot be read."""
    import yaml

    path = run_dir / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return HealthConfig(), None, [f"{path} could not be read: the default thresholds were used"]
    train = raw.get("train") or {}
    notes = []
    try:
        thresholds = HealthConfig.model_validate(train.get("health", train.get("watch")) or {})
    except ValueError as exc:
        thresholds = HealthConfig()
        notes.append(f"train.health in {path} is not valid here ({str(exc).splitlines()[0]}): defaults used")
    functions = (raw.get("reward") or {}).get("functions") or [{}]
    first = functions[0] if isinstance(functions[0], dict) else {}
    fallback = first.get("name") or (
        str(first.get("function", "")).rsplit(":", 1)[-1] if first.get("type") == "custom" else first.get("type")
    )
    return thresholds, (raw.get("eval") or {}).get("accuracy_reward") or fallback, notes


def replay(
    run: RunData, thresholds: HealthConfig, task_reward: str | None, monitor: HealthMonitor | None = None
) -> HealthMonitor:
    """Feed the run's metric rows (each spanning the steps since the previous one) and its evaluations,
    in step order, through ``monitor`` (default a fresh, silent one)."""
    monitor = monitor or HealthMonitor(thresholds, task_reward)
    evals = [e for e in run.evals if finite(e.get("accuracy")) is not None]
    previous, e = 0, 0
    for row in run.metrics:
        step = int(row["step"])
        while e < len(evals) and evals[e]["step"] < step:
            _observe_eval(monitor, evals[e])
            e += 1
        monitor.observe_step(step, row, span=step - previous)
        previous = step
    for rest in evals[e:]:
        _observe_eval(monitor, rest)
    return monitor


def _observe_eval(monitor: HealthMonitor, record: dict) -> None:
    n, rewards = record.get("num_prompts"), record.get("rewards")
    monitor.observe_eval(
        int(record["step"]),
        float(record["accuracy"]),
        n if isinstance(n, int) else None,
        {k: finite(v) for k, v in rewards.items()} if isinstance(rewards, dict) else None,
    )


def diagnose(run_dir: str | Path, out: str | Path | None = None, plots: bool = True) -> Diagnosis:
    """Replay ``run_dir`` and write ``report.md`` (and PNGs) to ``out`` (default ``<run_dir>/health``)."""
    run = load_run(run_dir)  # a clear UsageError when it is not a run directory
    if not run.metrics:
        raise UsageError(f"{run.path / 'metrics.jsonl'} has no logged step yet: nothing to diagnose.")
    thresholds, task_reward, notes = run_settings(run.path)
    monitor = replay(run, thresholds, task_reward)
    info = _run_info(run.path)
    if info.get("status") == "completed":  # the checks that judge a whole run; not one still going
        monitor.observe_end(int(info.get("step") or run.metrics[-1]["step"]))
    diagnosis = Diagnosis(run.path, monitor.verdict, monitor.findings, len(run.metrics), len(run.evals), notes=notes)
    target = Path(out).expanduser() if out is not None else run.path / "health"
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {target} is an existing file; give a directory.")
    target.mkdir(parents=True, exist_ok=True)
    if plots:
        from rlft.health.plots import plot_findings

        diagnosis.plots = plot_findings(run, diagnosis.findings, target, diagnosis.notes)
    diagnosis.report = target / "report.md"
    diagnosis.report.write_text(render_markdown(diagnosis, info), encoding="utf-8")
    return diagnosis


def _run_info(run_dir: Path) -> dict:
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def render_markdown(d: Diagnosis, info: dict) -> str:
    """The one-page report: verdict, each finding (what, where, the knob, its plot), then the overview."""
    bad = sum(f.severity == "unhealthy" for f in d.findings)
    healed = sum(f.recovered_step is not None for f in d.findings)
    lines = [
        f"# Health report: {d.run_dir.name}",
        "",
        f"**Verdict: {d.verdict}** - {len(d.findings)} finding(s): {bad} unhealthy, "
        f"{len(d.findings) - bad} warning(s){f', {healed} of them recovered' if healed else ''}; from "
        f"{d.steps_logged} logged rows of metrics.jsonl (last step {info.get('step', '?')}) and {d.evals} "
        "evaluation(s).",
        "",
    ]
    if info.get("status"):
        lines += [
            f"Run status (run.json): {info['status']}, step {info.get('step', '?')} of "
            f"{info.get('total_steps', '?')}."
            + (f" Stopped itself: {info['halted']['reason']}." if isinstance(info.get("halted"), dict) else ""),
            "",
        ]
    if d.findings:
        lines += ["| # | check | severity | first seen | last seen | knob |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {i} | {f.check} | {f.severity} | step {f.step} | step {f.last_step or f.step}"
            f"{f', recovered at step {f.recovered_step}' if f.recovered_step is not None else ''} | {f.knob} |"
            for i, f in enumerate(d.findings, 1)
        ]
        lines.append("")
    names = {p.stem: p.name for p in d.plots}
    for i, f in enumerate(d.findings, 1):
        lines += [
            f"## {i}. {f.check} ({f.severity}, from step {f.step})",
            "",
            f.message + ".",
            "",
            *([f"Recovered at step {f.recovered_step}.", ""] if f.recovered_step is not None else []),
            f"Knob: `{f.knob}`.",
            "",
        ]
        if f.check in names:
            lines += [f"![{f.check}]({names[f.check]})", ""]
    if not d.findings:
        lines += [
            "No health check fired: the run had a learning signal throughout, its numbers stayed finite, "
            "and nothing the checks look for (collapse, runaway, blow-up, tool failures, held-out accuracy "
            "falling beyond noise) was seen.",
            "",
        ]
    if "overview" in names:
        lines += ["## Overview", "", f"![overview]({names['overview']})", ""]
    if d.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in d.notes] + [""]
    return "\n".join(lines)
