"""The end of a sweep, read back from its registry: a table of runs and the errors of the failed ones.

    rows = summarize(store, sweep_id(sweep_dir))
    write_reports(rows, sweep_dir)   # summary.csv, summary.md, errors.md
    print_table(rows, sweep_dir)     # the same table in the terminal (rich)

Everything comes from the registry and the run directories, never from the process that ran the
sweep, so ``rlft sweep --summary DIR`` prints the same thing again at any time (and while a sweep
still runs, what it has so far).
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlft.service.runner import read_run_info, tail_lines
from rlft.service.store import Job, JobStore
from rlft.sweep.failures import kill_diagnosis
from rlft.sweep.metrics import MAIN_METRICS
from rlft.sweep.registry import attempts_by_name, metrics_of

STDERR_TAIL_LINES = 20
HEALTH_COLOURS = {"healthy": "green", "warnings": "yellow", "unhealthy": "red"}


@dataclass
class RunRow:
    """One run of the sweep: its latest attempt's outcome, with the history of the earlier ones."""

    name: str
    status: str
    failure_class: str | None
    attempts: int
    seconds: float | None  # wall time of all its attempts together
    run_dir: str
    config_source: str | None
    final: dict = field(default_factory=dict)
    best: dict = field(default_factory=dict)
    error: str | None = None
    history: list[str] = field(default_factory=list)  # "1 failed (transient)", "2 success"
    health: str | None = None  # the run's health verdict (run.json), None when it recorded none
    health_checks: list[str] = field(default_factory=list)  # the checks that fired, unhealthy ones first


def summarize(store: JobStore, sweep: str) -> list[RunRow]:
    rows = []
    for name, jobs in attempts_by_name(store, sweep).items():
        last = jobs[-1]
        final, best = metrics_of(last)
        verdict, checks = health_of(last.run_dir)
        spans = [j.finished_at - j.started_at for j in jobs if j.started_at and j.finished_at]
        rows.append(
            RunRow(
                name=name,
                status=last.status,
                failure_class=last.failure_class,
                attempts=len(jobs),
                seconds=sum(spans) if spans else None,
                run_dir=last.run_dir,
                config_source=last.config_source,
                final=final,
                best=best,
                error=error_text(last) if last.status == "failed" else None,
                history=[
                    f"{j.attempt or i + 1} {j.status}" + (f" ({j.failure_class})" if j.failure_class else "")
                    for i, j in enumerate(jobs)
                ],
                health=verdict,
                health_checks=checks,
            )
        )
    return rows


def health_of(run_dir: str) -> tuple[str | None, list[str]]:
    """The health verdict run.json recorded (rlft.health; ``rlft diagnose`` gives the details) and the
    checks that fired."""
    health = read_run_info(run_dir).get("health")
    if not isinstance(health, dict) or not isinstance(health.get("verdict"), str):
        return None, []
    findings = [f for f in health.get("findings", []) if isinstance(f, dict)]
    return health["verdict"], [str(f.get("check")) for f in findings]


def _health_cell(row: RunRow) -> str:
    if row.health is None:
        return ""
    return row.health + (f" ({', '.join(row.health_checks[:3])})" if row.health_checks else "")


def error_text(job: Job) -> str:
    """What went wrong: run.json's error if the run recorded one, else the reason stored with the job
    (a config's validation problems), else the tail of its stderr."""
    info = read_run_info(job.run_dir)
    if info.get("status") == "failed" and info.get("error"):
        return str(info["error"])
    diagnosis = kill_diagnosis(job.run_dir) if job.failure_class == "oom" else None
    if diagnosis and diagnosis.get("error"):
        return str(diagnosis["error"])
    return job.summary or tail_lines(job.stderr_log, STDERR_TAIL_LINES) or "(no error text recorded)"


def metric_columns(rows: list[RunRow]) -> list[str]:
    """The main metrics some run has, in :data:`MAIN_METRICS` order."""
    return [k for k, _ in MAIN_METRICS if any(k in r.final for r in rows)]


def succeeded(rows: list[RunRow]) -> bool:
    return bool(rows) and all(r.status == "success" for r in rows)


def _number(value) -> str:
    return "" if value is None else f"{value:.4g}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _cells(row: RunRow, metrics: list[str]) -> list[str]:
    cells = [
        row.name,
        row.status,
        row.failure_class or "",
        str(row.attempts),
        _duration(row.seconds),
        _health_cell(row),
    ]
    return cells + [
        f"{_number(row.final.get(k))} / {_number(row.best.get(k))}" if k in row.final else "" for k in metrics
    ]


# ---------------------------------------------------------------------- files


def write_reports(rows: list[RunRow], sweep_dir: Path) -> list[Path]:
    """summary.csv, summary.md and errors.md in ``sweep_dir``; returns their paths."""
    return [
        _write_csv(rows, sweep_dir / "summary.csv"),
        _write_markdown(rows, sweep_dir / "summary.md", sweep_dir),
        _write_errors(rows, sweep_dir / "errors.md"),
    ]


def _write_csv(rows: list[RunRow], path: Path) -> Path:
    metrics = metric_columns(rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(
            [
                "name",
                "status",
                "failure_class",
                "attempts",
                "seconds",
                "health",
                "health_checks",
                *(f"{k}_{w}" for k in metrics for w in ("final", "best")),
                "run_dir",
                "config_source",
                "error",
            ]
        )
        for r in rows:
            out.writerow(
                [
                    r.name,
                    r.status,
                    r.failure_class or "",
                    r.attempts,
                    "" if r.seconds is None else f"{r.seconds:.2f}",
                    r.health or "",
                    " ".join(r.health_checks),
                    *(v for k in metrics for v in (r.final.get(k, ""), r.best.get(k, ""))),
                    r.run_dir,
                    r.config_source or "",
                    gist(r.error) if r.error else "",
                ]
            )
    return path


def headline(rows: list[RunRow]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    verdicts: dict[str, int] = {}
    for r in rows:
        if r.health is not None:
            verdicts[r.health] = verdicts.get(r.health, 0) + 1
    health = ("; health: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))) if verdicts else ""
    return f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + health


def _write_markdown(rows: list[RunRow], path: Path, sweep_dir: Path) -> Path:
    metrics = metric_columns(rows)
    head = [
        "run",
        "status",
        "failure class",
        "attempts",
        "duration",
        "health",
        *(f"{k} (final / best)" for k in metrics),
    ]
    lines = [
        f"# Sweep {sweep_dir.name}",
        "",
        headline(rows),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r, metrics)) + " |" for r in rows]
    failed = [r for r in rows if r.status == "failed"]
    if failed:
        lines += ["", f"{len(failed)} failed: see errors.md."]
    unhealthy = [r for r in rows if r.health == "unhealthy"]
    if unhealthy:
        lines += [
            "",
            f"{len(unhealthy)} unhealthy (completed, but not learning as they should): "
            f"`rlft diagnose RUN_DIR` writes each one's report.",
        ]
    lines += ["", "Run directories (overlay their curves with `rlft plot`):", ""]
    lines += [f"- {r.name}: `{r.run_dir}`" for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _write_errors(rows: list[RunRow], path: Path) -> Path:
    failed = [r for r in rows if r.status == "failed"]
    lines = ["# Failed runs", ""]
    if not failed:
        lines.append("None: every run that ended, ended well." if rows else "No runs.")
    for r in failed:
        lines += [
            f"## {r.name}: {r.failure_class or 'unknown'}",
            "",
            f"- attempts: {r.attempts} ({'; '.join(r.history)})",
            f"- config: `{r.config_source}`",
            f"- run directory: `{r.run_dir}`",
            "",
            "```",
            (r.error or "").strip(),
            "```",
            "",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------- terminal and plots


def print_table(rows: list[RunRow], sweep_dir: Path, file=None) -> None:
    """The summary table on the terminal (wide enough for every column when the output is not one)."""
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    tty = getattr(out, "isatty", lambda: False)()
    console = Console(file=out, width=None if tty else 200, highlight=False)
    metrics = metric_columns(rows)
    table = Table(title=f"sweep {sweep_dir}: {headline(rows)}", title_justify="left")
    table.add_column("run", min_width=min(30, max(len(r.name) for r in rows)), overflow="fold")
    for name in ("status", "class", "attempts", "duration", "health"):
        table.add_column(name, no_wrap=True)
    for key in metrics:
        table.add_column(f"{key}\nfinal / best", overflow="fold")
    colour = {"success": "green", "failed": "red", "cancelled": "yellow"}
    for r in rows:
        cells = _cells(r, metrics)
        cells[1] = f"[{colour.get(r.status, 'white')}]{r.status}[/]"
        cells[5] = f"[{HEALTH_COLOURS.get(r.health or '', 'white')}]{cells[5]}[/]" if cells[5] else ""
        table.add_row(*cells)
    console.print(table)
    for r in rows:
        if r.status == "failed":
            console.print(f"[red]{r.name}[/] ({r.failure_class}): {gist(r.error)}", soft_wrap=True)
        elif r.health == "unhealthy":
            console.print(
                f"[red]{r.name}[/] is unhealthy ({', '.join(r.health_checks)}): rlft diagnose {r.run_dir}",
                soft_wrap=True,
            )


def gist(text: str | None, limit: int = 200) -> str:
    """An error in one line: its first line, and the first problem when the first line only introduces them."""
    lines = [s.strip() for s in (text or "").splitlines() if s.strip()]
    if not lines:
        return "(no error text recorded)"
    line = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def write_plots(rows: list[RunRow], sweep_dir: Path) -> tuple[list[Path], str | None]:
    """Overlaid curves of every run that logged a step, in ``<sweep_dir>/plots``: (paths, why not)."""
    dirs = [r.run_dir for r in rows if (Path(r.run_dir) / "metrics.jsonl").is_file()]
    if not dirs:
        return [], "no run logged a step"
    if importlib.util.find_spec("matplotlib") is None:
        return [], "matplotlib is not installed"
    from rlft.errors import UsageError
    from rlft.logging.plots import plot_runs

    try:
        return plot_runs(dirs, sweep_dir / "plots"), None
    except UsageError as exc:
        return [], str(exc)


def as_json(rows: list[RunRow], sweep_dir: Path, files: list[Path]) -> dict:
    return {
        "sweep": str(sweep_dir),
        "succeeded": succeeded(rows),
        "runs": [asdict(r) for r in rows],
        "files": [str(p) for p in files],
    }
